"""The queue's depth (conveyor/jobqueue/depth.py) against a real Redis, step by step, through the states
the api and the workers put the streams in: entries added to the bands of two shards and to a worker's
own stream (the api's ENQUEUE script), read by a worker (XREADGROUP: running), finished (XACK then
XDEL, as the worker's Publisher.ack) — including the state where the group's last-delivered entry is
deleted while a backlog waits, in which Redis stops reporting the group's lag."""

from __future__ import annotations

from collections import Counter

from conveyor.jobqueue.bands import Band
from conveyor.jobqueue.depth import OWN, read_depth
from conveyor.jobqueue.keys import WORKER_GROUP, Keys
from conveyor.jobqueue.queue import ensure_group
from conveyor.jobqueue.scripts.jobs import ENQUEUE

KEYS = Keys("depth", jobs_shards=2)
OWNER = "w-own"


async def places(redis) -> tuple[Counter[tuple[int, str]], Counter[tuple[int, str]]]:  # type: ignore[no-untyped-def]
    """(queued, running) by (shard, place), as read_depth reports them (zero places left out)."""
    queued: Counter[tuple[int, str]] = Counter()
    running: Counter[tuple[int, str]] = Counter()
    for place in await read_depth(redis, KEYS):
        queued[(place.shard, place.band)] += place.queued
        running[(place.shard, place.band)] += place.running
    return +queued, +running


async def take(redis, stream: str) -> str:  # type: ignore[no-untyped-def]
    """A worker reads the stream's next entry (it is running from now on)."""
    [[_stream, [(entry_id, _fields)]]] = await redis.xreadgroup(WORKER_GROUP, "c1", {stream: ">"}, count=1)
    return str(entry_id)


async def finish(redis, stream: str, entry_id: str) -> None:  # type: ignore[no-untyped-def]
    """The worker's acknowledgement: XACK, then XDEL (conveyor/worker/publisher.py)."""
    await redis.xack(stream, WORKER_GROUP, entry_id)
    await redis.xdel(stream, entry_id)


async def test_the_depth_follows_every_step_of_a_backlog_filling_and_draining(redis) -> None:  # type: ignore[no-untyped-def]
    await ensure_group(redis, KEYS)
    assert await places(redis) == (Counter(), Counter())
    high0, low1 = KEYS.jobs_stream(0, Band.HIGH), KEYS.jobs_stream(1, Band.LOW)
    own = KEYS.own_stream(1, OWNER)
    await redis.sadd(KEYS.owners(1), OWNER)
    await redis.xgroup_create(own, WORKER_GROUP, id="0", mkstream=True)
    queued: Counter[tuple[int, str]] = Counter()
    running: Counter[tuple[int, str]] = Counter()

    for i in range(3):
        await redis.xadd(high0, {"id": f"h{i}"})
        queued[(0, "high")] += 1
        assert await places(redis) == (+queued, +running)
    await redis.xadd(low1, {"id": "l0"})
    queued[(1, "low")] += 1
    for i in range(2):  # placed by affinity: the api's own script, onto the worker's own stream
        shared = KEYS.jobs_stream(1, Band.NORMAL)
        assert await redis.eval(ENQUEUE.source, 3, own, shared, KEYS.placed(1), "id", f"o{i}") == 1
        queued[(1, OWN)] += 1
    assert await places(redis) == (+queued, +running)

    # Two high entries run; the second (the group's last-delivered entry) finishes first while the
    # first runs and one waits: the state in which XINFO GROUPS reports the lag as nil.
    first, second = await take(redis, high0), await take(redis, high0)
    queued[(0, "high")] -= 2
    running[(0, "high")] += 2
    assert await places(redis) == (+queued, +running)
    await finish(redis, high0, second)
    running[(0, "high")] -= 1
    assert await places(redis) == (+queued, +running)
    await finish(redis, high0, first)
    running[(0, "high")] -= 1
    assert await places(redis) == (+queued, +running)

    # Drain the rest, one read and one finish at a time, checking after each.
    for stream, place in [(own, (1, OWN)), (high0, (0, "high")), (low1, (1, "low")), (own, (1, OWN))]:
        entry_id = await take(redis, stream)
        queued[place] -= 1
        running[place] += 1
        assert await places(redis) == (+queued, +running)
        await finish(redis, stream, entry_id)
        running[place] -= 1
        assert await places(redis) == (+queued, +running)
    assert await places(redis) == (Counter(), Counter())


async def test_a_gone_own_stream_and_a_missing_band_count_as_empty(redis) -> None:  # type: ignore[no-untyped-def]
    """Before any group exists, and for an owner whose stream the fleet deleted (FORGET), nothing is
    counted and nothing fails; an entry on a band with no group yet counts as waiting."""
    await redis.sadd(KEYS.owners(0), "w-gone")
    await redis.xadd(KEYS.jobs_stream(0, Band.BATCH), {"id": "b0"})
    assert await places(redis) == (Counter({(0, "batch"): 1}), Counter())
