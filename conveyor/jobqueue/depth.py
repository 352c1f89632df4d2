"""How many jobs wait and run in the queue: what the api's `GET /queue` and `/metrics` report and an
autoscaler scales the workers on (docs/operations/scaling.md).

A job waits in one of its shard's priority bands or in a worker's own stream (prefix affinity). Read
from the streams themselves, not from the consumer group's `lag`: workers delete each entry they
acknowledge, and once the group's last-delivered entry is deleted while a backlog waits, Redis
reports `lag` as unknown (nil) until the group catches up. So each stream's waiting jobs are its
length less its pending entries (read and not acknowledged: running), which stays exact because an
entry leaves the stream only once acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from conveyor.jobqueue.bands import BANDS
from conveyor.jobqueue.keys import WORKER_GROUP, Keys
from conveyor.jobqueue.queue import read_owners
from conveyor.jobqueue.scripts.jobs import DEPTH

OWN = "own"  # the place of a shard's workers' own streams, beside its bands


@dataclass(frozen=True, slots=True)
class QueuePlace:
    """The jobs of one place of the queue: a shard's priority band, or its workers' own streams."""

    shard: int
    band: str  # a Band's value, or OWN
    queued: int  # no worker has read them yet
    running: int  # read, not yet acknowledged


async def read_depth(redis: Redis, keys: Keys) -> list[QueuePlace]:
    """Every place of the queue, shard by shard (bands highest first, then OWN): two round trips, the
    shards' owners, then one DEPTH script per shard. Raises what Redis raises."""
    pipe = redis.pipeline(transaction=False)
    for shard, workers in enumerate(await read_owners(redis, keys)):
        streams = [*keys.shard_streams(shard), *(keys.own_stream(shard, w) for w in sorted(workers))]
        # EVAL, not EVALSHA: a scrape's one call per shard, and nothing to reload after a restart
        pipe.execute_command("EVAL", DEPTH.source, len(streams), *streams, WORKER_GROUP)
    replies = await pipe.execute()
    out: list[QueuePlace] = []
    for shard, reply in enumerate(replies):
        counts = [(int(n), int(pending)) for n, pending in zip(reply[::2], reply[1::2], strict=True)]
        for band, (length, pending) in zip(BANDS, counts, strict=False):
            out.append(QueuePlace(shard, band.value, max(length - pending, 0), pending))
        own = counts[len(BANDS):]
        out.append(QueuePlace(shard, OWN, sum(max(length - pending, 0) for length, pending in own),
                              sum(pending for _length, pending in own)))
    return out
