"""Live events: sharded pub/sub on a cluster, classic pub/sub on a single node.

A classic PUBLISH on Redis Cluster is broadcast to every node (its cost per token grows with the
cluster); SPUBLISH stays inside the shard that owns the channel's hash slot: an api process's channel
(Keys.live) lives on one node, which its relay subscribes to. The control channel (cancels, follow
notices) stays classic on purpose: every worker must hear it, and it carries one message per cancel.
"""

from __future__ import annotations

from typing import Any

from conveyor.jobqueue.client import cluster_of
from conveyor.jobqueue.keys import OLD_API, Keys
from conveyor.wire.event_batch import dump_live


def publish_live(pipe: Any, channel: str, message: str) -> None:
    """Queues the publish of one live message on a client's pipeline. Never inside a script: there, a
    cluster refuses SPUBLISH to a channel outside the slot of the script's keys."""
    if cluster_of(pipe):
        pipe.spublish(channel, message)
    else:
        pipe.publish(channel, message)


def publish_to_followers(pipe: Any, keys: Keys, messages: dict[str, dict[str, str]]) -> None:
    """Queues one live message per api process: `messages` maps a follower (an api id, the record's
    `watched`) to {job id: its events as dump_events wrote them}. An api from before per-process
    channels (OLD_API) gets each job's events on the job's own channel, as it listens."""
    for follower, batches in messages.items():
        if follower == OLD_API:
            for job_id, batch in batches.items():
                publish_live(pipe, keys.channel(job_id), batch)
        else:
            publish_live(pipe, keys.live(follower), dump_live(batches))
