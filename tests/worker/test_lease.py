"""Leases against the real Redis, and the outage backoff (pure): an entry that looks abandoned is
claimed only when it still does one sweep later, so the jobs of a worker that renews as soon as
Redis is back are never taken; and the worker's waits while Redis is down stay well inside the lease."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from conveyor.jobqueue.bands import Band
from conveyor.jobqueue.keys import WORKER_GROUP, Keys
from conveyor.jobqueue.queue import ensure_group
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.settings import Settings
from conveyor.worker.lease import Lease
from conveyor.worker.lease_loop import LeaseLoop
from conveyor.worker.outage import FIRST_DELAY_S, Backoff, outage_cap, until_up
from conveyor.worker.owned import InFlight, Owned

LEASE_MS = 500


def STREAM(keys: Keys) -> str:  # noqa: N802 - a constant of the test, computed from its keys
    return keys.jobs_stream(2, Band.LOW)


async def owner_of(redis, keys: Keys, entry_id: str) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    (row,) = await redis.xpending_range(STREAM(keys), WORKER_GROUP, entry_id, entry_id, 1)
    return row["consumer"], row["times_delivered"]


async def test_an_entry_is_claimed_only_if_still_idle_past_the_lease_a_sweep_later(redis) -> None:  # type: ignore[no-untyped-def]
    keys = Keys(f"lease{uuid.uuid4().hex[:8]}", jobs_shards=3)
    await ensure_group(redis, keys)
    await ensure_group(redis, keys)  # a second call finds the group there and is a no-op
    scripts = Scripts(redis)
    entries = {}
    stream = STREAM(keys)  # not the first shard's normal band: reclaim sweeps every stream
    for owner in ("alive", "dead"):
        entries[owner] = await redis.xadd(stream, {"id": owner, "spec": "{}"})
        await redis.xreadgroup(WORKER_GROUP, owner, {stream: ">"}, count=1)
        # Redis's clock ran on through an outage: both entries look idle past the lease.
        await redis.xclaim(stream, WORKER_GROUP, owner, 0, [entries[owner]], idle=3 * LEASE_MS,
                           justid=True)
    sweeper = Lease(redis, keys, scripts, "sweeper", LEASE_MS)

    assert await sweeper.reclaim(10) == []  # first sighting: suspects, nothing claimed
    assert await owner_of(redis, keys, entries["alive"]) == ("alive", 1)
    assert await Lease(redis, keys, scripts, "alive", LEASE_MS).renew([(stream, entries["alive"])]) == set()

    claimed = await sweeper.reclaim(10)  # a heartbeat later: only the entry nobody renewed
    assert [(e.stream, e.entry_id, e.fields["id"], e.deliveries) for e in claimed] == [
        (stream, entries["dead"], "dead", 2)]
    assert await owner_of(redis, keys, entries["alive"]) == ("alive", 1)
    assert await owner_of(redis, keys, entries["dead"]) == ("sweeper", 2)

    sweeper.forget_suspects()  # after the sweeper's own outage it starts over
    await redis.xclaim(stream, WORKER_GROUP, "alive", 0, [entries["alive"]], idle=3 * LEASE_MS,
                       justid=True)
    assert await sweeper.reclaim(10) == []
    assert await owner_of(redis, keys, entries["alive"]) == ("alive", 1)


@pytest.mark.parametrize(("lease_ms", "heartbeat_ms"), [(30000, 5000), (2000, 250), (600, 100), (3000, 1000)])
def test_the_wait_between_tries_stays_well_inside_the_lease(lease_ms: int, heartbeat_ms: int) -> None:
    cap = outage_cap(Settings(job_lease_ms=lease_ms, heartbeat_interval_ms=heartbeat_ms))
    assert cap <= lease_ms / 4 / 1000 and cap <= heartbeat_ms / 2 / 1000
    backoff = Backoff(cap)
    delays = [backoff.delay() for _ in range(20)]
    assert delays[0] <= FIRST_DELAY_S
    assert max(delays) <= cap
    assert min(delays[-5:]) >= cap / 2  # it does back off, to the cap


async def test_until_up_retries_redis_faults_only() -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise RedisConnectionError("Connection refused")
        return "done"

    assert await until_up("test", flaky, 0.01) == "done"
    assert calls == 4

    async def broken() -> None:
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError):
        await until_up("test", broken, 0.01)


async def test_a_renewal_racing_a_final_ack_does_not_drop_the_ended_job(redis) -> None:  # type: ignore[no-untyped-def]
    # The publisher writes a job's final event, then acknowledges its entry; a renewal that was
    # already under way then finds the entry gone from the pending list. That job ended here: it must
    # not be logged and dropped as taken over. An entry gone while its job still runs here is lost.
    keys = Keys(f"lease{uuid.uuid4().hex[:8]}", jobs_shards=3)
    await ensure_group(redis, keys)
    stream = STREAM(keys)
    ids = [await redis.xadd(stream, {"id": name, "spec": "{}"}) for name in ("ended", "running")]
    await redis.xreadgroup(WORKER_GROUP, "w0", {stream: ">"}, count=2)
    owned = Owned()
    jobs = [InFlight(job_id=name, entry_id=entry_id, created_at=0.0, stream=stream)
            for name, entry_id in zip(("ended", "running"), ids, strict=True)]
    for job in jobs:
        owned.add(job)
    jobs[0].ended = True  # its final event is written (conveyor/worker/publisher.py sets it before the ack)
    await redis.xack(stream, WORKER_GROUP, *ids)
    lost: list[InFlight] = []
    lease = Lease(redis, keys, Scripts(redis), "w0", LEASE_MS)
    loop = LeaseLoop(lease, owned, None, None, None, None, None, lost.append,  # type: ignore[arg-type]
                     lambda: False, 1.0, None)  # type: ignore[arg-type]
    await loop._renew()
    assert lost == [jobs[1]]


async def test_a_heartbeat_cancelled_as_the_prefix_summary_arrives_ends(local) -> None:  # type: ignore[no-untyped-def]
    """A worker's stop cancels its heartbeat loop; if the engine thread's prefix summary arrives
    in the same turn of the event loop, the cancel must still end the beat (Python 3.11's
    asyncio.wait_for returned the summary instead, and the worker never stopped: a CI hang)."""
    from conveyor.worker.placement import WorkerAffinity

    summary: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
    asked = asyncio.Event()

    class Thread:  # the engine thread's side: the summary is settled later, by the test
        def cached_prefixes(self, limit: int) -> asyncio.Future[list[int]]:
            asked.set()
            return summary

    affinity = WorkerAffinity(local.redis, local.keys, None, "w-cancel", True, 100, 600, 16)  # type: ignore[arg-type]
    beat = asyncio.create_task(affinity.beat(Thread(), 5.0))  # type: ignore[arg-type]
    await asked.wait()  # the beat asked in the step it now waits in
    summary.set_result([])
    beat.cancel()
    with pytest.raises(asyncio.CancelledError):
        await beat
    assert await local.redis.get(local.keys.prefixes("w-cancel")) is None  # it published nothing


async def test_one_worker_at_a_time_sweeps_and_a_gone_sweepers_turn_passes_on(redis) -> None:  # type: ignore[no-untyped-def]
    keys = Keys(f"lease{uuid.uuid4().hex[:8]}")
    scripts = Scripts(redis)
    a, b = (Lease(redis, keys, scripts, name, LEASE_MS) for name in ("a", "b"))
    assert await a.sweeps(True, 60_000) and not await b.sweeps(True, 60_000)  # the fleet sweeps once
    assert await a.sweeps(True, 60_000)  # the holder keeps its turn, renewed
    assert not await a.sweeps(False, 60_000)  # no room (or draining): it gives the turn up ...
    assert await b.sweeps(True, 60_000)  # ... and the next one with room takes it
    await redis.pexpire(keys.sweeper, 1)  # b died: its turn runs out (two heartbeats in a worker)
    while await redis.exists(keys.sweeper):
        await asyncio.sleep(0.005)
    assert await a.sweeps(True, 60_000)
    await a.leave()  # a drained worker hands its turn back at once
    assert not await redis.exists(keys.sweeper)
    assert await b.sweeps(True, 60_000)
