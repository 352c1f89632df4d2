"""Band order across shards on a real Valkey (conveyor/worker/queue_reader.py): a worker with room
for two takes the high-priority entries of one shard before the low ones of the shard it reads
first, and never more than its room."""

from __future__ import annotations

from redis.asyncio import Redis

from conveyor.jobqueue.bands import Band
from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.queue import ensure_group
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.worker.placement import WorkerAffinity
from conveyor.worker.queue_reader import QueueReader


def reader(redis: Redis, keys: Keys, affinity: bool = False) -> QueueReader:
    scripts = Scripts(redis)
    place = WorkerAffinity(redis, keys, scripts, "w0", affinity, wait_ms=1000, lease_ms=30000, block_size=16)
    return QueueReader(redis, keys, scripts, "w0", starvation_every=0, affinity=place)


async def fill(redis: Redis, keys: Keys, shard: int, band: Band, n: int) -> None:
    for i in range(n):
        await redis.xadd(keys.jobs_stream(shard, band), {"job": f"{shard}-{band.value}-{i}"})


async def test_a_read_takes_the_fleets_highest_band_first_whatever_the_shard(redis: Redis) -> None:
    keys = Keys("bands", jobs_shards=3)
    await ensure_group(redis, keys)
    await fill(redis, keys, 0, Band.LOW, 4)  # the shard this worker's first read starts at
    await fill(redis, keys, 1, Band.NORMAL, 1)
    await fill(redis, keys, 2, Band.HIGH, 2)
    queue = reader(redis, keys)

    first = await queue.poll(2)
    assert sorted(e.fields["job"] for e in first) == ["2-high-0", "2-high-1"]
    second = await queue.poll(2)  # starts at shard 1: the normal one, then one low from shard 0
    assert sorted(e.fields["job"] for e in second) == ["0-low-0", "1-normal-0"]
    rest = await queue.poll(10)
    assert sorted(e.fields["job"] for e in rest) == ["0-low-1", "0-low-2", "0-low-3"]
    assert await queue.poll(10) == []


async def test_an_own_stream_comes_before_every_band(redis: Redis) -> None:
    keys = Keys("own", jobs_shards=2)
    await ensure_group(redis, keys)
    queue = reader(redis, keys, affinity=True)
    await queue.affinity.register()
    await fill(redis, keys, 0, Band.HIGH, 2)
    await redis.xadd(keys.own_stream(1, "w0"), {"job": "placed-here"})

    taken = await queue.poll(2)
    assert sorted(e.fields["job"] for e in taken) == ["0-high-0", "placed-here"]
