"""Worker processes that die: a job resumes elsewhere exactly where its events end; a job that
kills every worker it meets is dead-lettered after max_attempts; a long job on a healthy worker is
never taken over."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.keys import WORKER_GROUP
from conveyor.wire.job import JobStatus, RecordField
from conveyor.worker.faults import CRASH_EXIT_CODE, CRASH_ON_TOKEN_ENV

pytestmark = pytest.mark.slow

PROMPT = [101, 2024, 318, 257, 1332, 13]


@pytest.mark.parametrize("followed", [True, False], ids=["followed", "unfollowed"])
async def test_sigkill_mid_generation_resumes_on_another_worker(fleet, make_spec, followed: bool) -> None:  # type: ignore[no-untyped-def]
    """Also for a job nobody follows, whose events the worker writes every unfollowed interval (50 ms
    here, so the kill lands mid-job on a fast CPU too): the next owner computes again what was lost."""
    fleet.start("w0", "w1", CONVEYOR_UNFOLLOWED_INTERVAL_MS="50")
    await fleet.wait_ready()
    n = 600
    job_id = await fleet.submit(make_spec(PROMPT, max_new_tokens=n), followed=followed)
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
    fleet.start("w0", "w1")
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
