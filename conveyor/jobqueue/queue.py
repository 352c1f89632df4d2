"""The queue's setup and shape, shared by the api and the workers: the jobs streams (shards × priority
bands, conveyor/jobqueue/keys.py) and their consumer group."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from conveyor.jobqueue.keys import WORKER_GROUP, Keys

EntryRef = tuple[str, str]  # (stream, entry id): entry ids are unique only within one stream


@dataclass(slots=True)
class Entry:
    """One entry of a jobs stream, as read or reclaimed, with its delivery count."""

    stream: str
    entry_id: str
    fields: dict[str, str]
    deliveries: int = 1

    @property
    def ref(self) -> EntryRef:
        return (self.stream, self.entry_id)


async def ensure_group(redis: Redis, keys: Keys) -> None:
    """Create the workers' consumer group (and the stream) on every jobs stream unless it exists: the
    api does at start-up, so the queue's depth is measured before any worker runs; a worker at start
    and when a stream was deleted under it (NOGROUP). One pipeline of one-key commands."""
    pipe = redis.pipeline(transaction=False)
    for stream in keys.jobs_streams:
        pipe.xgroup_create(stream, WORKER_GROUP, id="0", mkstream=True)
    for result in await pipe.execute(raise_on_error=False):
        exists = isinstance(result, ResponseError) and "BUSYGROUP" in str(result)
        if isinstance(result, Exception) and not exists:  # anything but "it exists already" is a fault
            raise result


async def read_owners(redis: Redis, keys: Keys) -> list[set[str]]:
    """The workers with an own stream (prefix affinity), shard by shard: one pipeline of one-key
    SMEMBERS (one slot each on Redis Cluster)."""
    pipe = redis.pipeline(transaction=False)
    for shard in range(keys.jobs_shards):
        pipe.smembers(keys.owners(shard))
    return [set(members) for members in await pipe.execute()]


def by_stream(refs: Iterable[EntryRef]) -> dict[str, list[str]]:
    """Entry ids grouped by their stream, for the commands that take one stream each."""
    out: dict[str, list[str]] = defaultdict(list)
    for stream, entry_id in refs:
        out[stream].append(entry_id)
    return dict(out)
