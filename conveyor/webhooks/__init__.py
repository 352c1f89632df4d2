"""Webhooks: signed, retried deliveries of a job's `started` and `completed` events, by RQ workers.

The engine worker (and the api, for jobs it ends in the queue) only enqueues an RQ job
(`enqueue.py`), from a thread of its own; `conveyor webhooks` runs the RQ worker that delivers
(`delivery.py`), signs (`signing.py`) and refuses internal targets (`ssrf.py`). Nothing here
imports torch.
"""
