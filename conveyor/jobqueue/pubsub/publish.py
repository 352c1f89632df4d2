"""Per-job live events: sharded pub/sub on a cluster, classic pub/sub on a single node.

A classic PUBLISH on Redis Cluster is broadcast to every node (its cost per token grows with the
cluster); SPUBLISH stays inside the shard that owns the channel's hash slot, and a job's channel
carries the job's hash tag, so it lives with the job's record and event stream. The control channel
(cancels) stays classic on purpose: every worker must hear it, and it carries one message per cancel.
"""

from __future__ import annotations

from typing import Any

from conveyor.jobqueue.client import cluster_of
from conveyor.jobqueue.scripts import PublishCommand


def live_publish_command(redis: object) -> PublishCommand:
    """The command that publishes a job's live events through `redis` (a client or its pipeline).
    The scripts that publish are built with it (conveyor/jobqueue/scripts/): inside a script,
    SPUBLISH needs the channel in the slot of the script's keys, which a job's channel is."""
    return "SPUBLISH" if cluster_of(redis) else "PUBLISH"


def publish_live(pipe: Any, channel: str, message: str) -> None:
    """Queues the publish of one live event on a client's pipeline."""
    if cluster_of(pipe):
        pipe.spublish(channel, message)
    else:
        pipe.publish(channel, message)
