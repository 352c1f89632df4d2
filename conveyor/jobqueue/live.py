"""Per-job live events: sharded pub/sub on a cluster, classic pub/sub on a single node.

A classic PUBLISH on Redis Cluster is broadcast to every node (its cost per token grows with the
cluster); SPUBLISH stays inside the shard that owns the channel's hash slot, and a job's channel
carries the job's hash tag, so it lives with the job's record and event stream. The control channel
(cancels) stays classic on purpose: every worker must hear it, and it carries one message per cancel.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import ClusterPipeline, RedisCluster


def cluster_of(redis: object) -> bool:
    """Whether a client, or a pipeline of one, talks to a Redis Cluster."""
    return isinstance(redis, RedisCluster | ClusterPipeline)


def publish_live(pipe: Any, channel: str, message: str) -> None:
    """Queues the publish of one live event on a client's pipeline."""
    if cluster_of(pipe):
        pipe.spublish(channel, message)
    else:
        pipe.publish(channel, message)


def live_script(source: str, redis: object) -> str:
    """A Lua script's source with its live publishes made sharded on a cluster. The scripts name
    the command as `redis.call('PUBLISH', <job channel>, ...)`; the channel shares the slot of the
    script's keys, as SPUBLISH inside a script requires."""
    if not cluster_of(redis):
        return source
    return source.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',")
