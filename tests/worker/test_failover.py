"""Worker processes that die: a job resumes elsewhere exactly where its events end; a job that
kills every worker it meets is dead-lettered after max_attempts; a long job on a healthy worker is
never taken over."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.client import cluster_of
from conveyor.jobqueue.keys import WORKER_GROUP
from conveyor.wire.event_batch import load_live
from conveyor.wire.job import JobStatus, RecordField
from conveyor.worker.faults import CRASH_EXIT_CODE, CRASH_ON_TOKEN_ENV
from tests.worker.conftest import FOLLOWER

pytestmark = pytest.mark.slow

PROMPT = [101, 2024, 318, 257, 1332, 13]


@pytest.mark.parametrize("followed", [True, False], ids=["followed", "unfollowed"])
async def test_sigkill_mid_generation_resumes_on_another_worker(fleet, make_spec, followed: bool) -> None:  # type: ignore[no-untyped-def]
    """The worker writes the job's events every durable interval (50 ms here, so the kill lands mid-job
    on a fast CPU too): the next owner computes again what was lost. A followed job's tokens also went
    out live, mostly ahead of the stream: what a live subscriber saw, from either owner, equals an
    uninterrupted run."""
    fleet.start("w0", "w1", CONVEYOR_DURABLE_INTERVAL_MS="50")
    await fleet.wait_ready()
    n = 600
    spec = make_spec(PROMPT, max_new_tokens=n)
    sharded = cluster_of(fleet.redis)  # the worker SPUBLISHes on a cluster
    live = fleet.redis.pubsub()
    await (live.ssubscribe if sharded else live.subscribe)(fleet.keys.live(FOLLOWER))
    read = live.get_sharded_message if sharded else live.get_message
    job_id = await fleet.submit(spec, followed=followed)
    assert (RecordField.WATCHED in await fleet.record(job_id)) is followed
    await fleet.wait_events(job_id, 100)
    victim = (await fleet.record(job_id))[RecordField.WORKER]
    survivor = {"w0": "w1", "w1": "w0"}[victim]
    fleet.signal(victim, signal.SIGKILL)
    written = len(await fleet.events(job_id))
    assert written < n, "the job finished before the kill: make it longer"

    result = await fleet.result(job_id)
    reference_id = await fleet.submit(make_spec(PROMPT, max_new_tokens=n))  # uninterrupted, on the survivor
    reference = await fleet.result(reference_id)

    assert result.status is JobStatus.SUCCEEDED, result
    events = await fleet.check_events(job_id, n)
    reference_events = await fleet.check_events(reference_id, n)
    assert [e.token.id for e in events] == [e.token.id for e in reference_events]  # type: ignore[union-attr]
    assert result.generated_text == reference.generated_text
    seen: dict[int, int] = {}
    while (message := await read(timeout=0.5)) is not None:
        if message["type"] in ("message", "smessage"):
            batch = load_live(message["data"]).get(spec.id, [])
            seen |= {e.index: e.token.id for e in batch if e.token is not None}
    await live.aclose()
    if followed:  # the next owner published live from the last event written on (the ones before it
        # that the dead worker wrote but had not published yet, a relay reads from the stream)
        assert set(range(written - 1, n)) <= set(seen), sorted(set(range(n)) - set(seen))
    else:
        assert seen == {}  # nothing live for a job nobody follows
    assert all(seen[i] == reference_events[i].token.id for i in seen)  # type: ignore[union-attr]
    record = await fleet.record(job_id)
    assert (record[RecordField.WORKER], record[RecordField.ATTEMPTS]) == (survivor, "2")
    assert fleet.procs[victim].wait(5) == -signal.SIGKILL
    assert await fleet.pending() == 0


async def test_a_job_that_kills_its_worker_every_time_is_dead_lettered(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    poison_token, max_attempts = 48999, 2
    fleet.start("w0", "w1", "w2", **{CRASH_ON_TOKEN_ENV: str(poison_token),
                                     "CONVEYOR_MAX_ATTEMPTS": str(max_attempts)})
    await fleet.wait_ready()
    job_id = await fleet.submit(make_spec([5, poison_token, 7], max_new_tokens=20))

    result = await fleet.result(job_id)
    assert result.status is JobStatus.FAILED
    assert result.error is not None and f"max_attempts={max_attempts}" in result.error
    codes = sorted(proc.poll() for proc in fleet.procs.values() if proc.poll() is not None)
    assert codes == [CRASH_EXIT_CODE] * max_attempts, fleet.logs()  # one death per attempt, no more
    dead = await fleet.redis.xrange(fleet.keys.dead_letter_stream)
    assert [(f["id"], f["deliveries"]) for _id, f in dead] == [(job_id, str(max_attempts + 1))]
    assert await fleet.pending() == 0

    fine = await fleet.submit(make_spec(PROMPT, max_new_tokens=5))  # the last worker still serves
    assert (await fleet.result(fine)).status is JobStatus.SUCCEEDED


async def test_a_long_job_on_a_healthy_worker_is_never_taken_over(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    # The simulated engine at 5 ms a step (its KV cache allocates nothing): the job outlasts three
    # leases however fast the machine (the tiny model made its 4000 tokens in under three 2 s leases
    # on a quiet one).
    fleet.start("w0", "w1", CONVEYOR_ENGINE="sim", CONVEYOR_SIM_STEP_FIXED_MS="5", CONVEYOR_SIM_WEIGHT_GB="0",
                CONVEYOR_SIM_PREFILL_GFLOP_PER_TOKEN="0", CONVEYOR_KV_CACHE_MEMORY="8GiB")
    await fleet.wait_ready()
    lease_ms = int(fleet.env["CONVEYOR_JOB_LEASE_MS"])
    job_id = await fleet.submit(make_spec(PROMPT, max_new_tokens=4000))  # runs until cancelled below
    await fleet.wait_events(job_id, 1)
    owner = (await fleet.record(job_id))[RecordField.WORKER]
    (entry,) = await fleet.pending_rows()
    entry_id, stream = entry["message_id"], entry["stream"]
    submitted_ms = int(entry_id.split("-")[0])  # the stream entry's ID is Redis's clock at XADD

    # Watch its lease, by Redis's own clock, until the job has been pending for three leases.
    idle_ms: list[int] = []
    deadline = time.monotonic() + 120
    while True:
        rows = await fleet.redis.xpending_range(stream, WORKER_GROUP, entry_id, entry_id, 1)
        assert rows, "the job ended before it had run for three leases: make it longer"
        assert (rows[0]["consumer"], rows[0]["times_delivered"]) == (owner, 1)
        idle_ms.append(rows[0]["time_since_delivered"])
        seconds, micros = await fleet.redis.time()
        if seconds * 1000 + micros // 1000 - submitted_ms > 3 * lease_ms:
            break
        assert time.monotonic() < deadline, f"the job did not run for three leases\n{fleet.logs()}"
        await asyncio.sleep(0.05)
    assert max(idle_ms) < lease_ms, "its lease was not renewed in time"
    assert any(b < a for a, b in zip(idle_ms, idle_ms[1:], strict=False)), "no renewal was seen"

    await JobStore(fleet.redis, fleet.keys, fleet.settings).cancel(job_id)
    result = await fleet.result(job_id)
    assert result.status is JobStatus.CANCELLED
    events = await fleet.events(job_id)
    assert [e.index for e in events] == list(range(len(events)))  # every index once, one writer
    record = await fleet.record(job_id)
    assert (record[RecordField.WORKER], record[RecordField.ATTEMPTS]) == (owner, "1")
    assert "reclaimed" not in fleet.logs()
    assert await fleet.pending() == 0
