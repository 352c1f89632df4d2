"""`conveyor bench`: an HTTP load generator for OpenAI-, TGI- and Conveyor-job-compatible servers.

workloads (what is sent), arrival (when), client_* (how, per dialect), run (drives one run),
metrics (figures from the per-request records), report (table/JSON), plots (PNG, optional extra).
"""
