"""Logs and traces shared by every role (api, worker, webhooks). Metrics live with each role."""
