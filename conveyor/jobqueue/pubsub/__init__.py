"""Pub/sub: a job's live events and the control channel.

- `publish.py`: the publish side — which command carries a job's live events (SPUBLISH on a
  cluster, PUBLISH on one node).
- `subscriptions.py`: the api's one pub/sub connection, its listeners, and its recovery.
- `sharded.py`: on a cluster, one such connection per node, channels routed by hash slot.
"""
