"""The queue's setup, shared by the api and the workers: the jobs stream and its consumer group."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from schemas.keys import WORKER_GROUP, Keys


async def ensure_group(redis: Redis, keys: Keys) -> None:
    """Create the workers' consumer group (and the jobs stream) unless it exists: the api does at
    start-up, so the queue's depth is measured before any worker runs; a worker at start and when
    the stream was deleted under it (NOGROUP)."""
    try:
        await redis.xgroup_create(keys.jobs_stream, WORKER_GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):  # anything but "it exists already" is a real fault
            raise
