"""The queue's layout with real worker processes: priority bands across the fleet, a sharded queue
that runs every job exactly once, and failover on a stream other than the first shard's normal band."""

from __future__ import annotations

import signal
import uuid

import pytest

from conveyor.jobqueue.bands import Band
from conveyor.wire.job import JobStatus, RecordField

pytestmark = pytest.mark.slow

PROMPT = [101, 2024, 318, 257, 1332, 13]


async def test_a_high_priority_job_starts_before_the_low_ones_queued_ahead_of_it(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    # Two slots per worker, so the queue backs up; strictly highest band first for this test.
    fleet.start("w0", "w1", CONVEYOR_MAX_BATCH_SIZE="2", CONVEYOR_BAND_STARVATION_EVERY="0")
    await fleet.wait_ready()
    lows = [make_spec([1000 + i, 2000 + i, 3000 + i], max_new_tokens=24, priority=-10) for i in range(16)]
    for spec in lows:
        await fleet.submit(spec)
    await fleet.wait_events(lows[0].id, 1)  # the workers are busy with the first low jobs
    high = make_spec(PROMPT, max_new_tokens=4, priority=10)
    await fleet.submit(high)
    queued_behind = [s.id for s in lows if RecordField.STARTED_AT not in await fleet.record(s.id)]

    assert (await fleet.result(high.id)).status is JobStatus.SUCCEEDED
    for spec in lows:
        assert (await fleet.result(spec.id)).status is JobStatus.SUCCEEDED
    high_started = float((await fleet.record(high.id))[RecordField.STARTED_AT])
    later = [job_id for job_id in queued_behind
             if float((await fleet.record(job_id))[RecordField.STARTED_AT]) > high_started]
    assert len(queued_behind) >= 8, "the low jobs did not queue up: make them longer"
    # A read in flight when the high job was written may still take low ones: one per free slot.
    assert len(later) >= len(queued_behind) - 4, (len(later), len(queued_behind))


async def test_three_shards_spread_the_jobs_and_run_each_exactly_once(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    fleet.use_shards(3)
    fleet.start("w0", "w1")
    await fleet.wait_ready()
    specs = [make_spec([1000 + i, 2000 + i], max_new_tokens=3 + i % 5, priority=(10, 0, -10, -100)[i % 4])
             for i in range(30)]
    for spec in specs:
        await fleet.submit(spec)
    places = {(fleet.keys.shard_of(s.id), s.priority) for s in specs}
    assert {shard for shard, _ in places} == {0, 1, 2}

    for spec in specs:
        assert (await fleet.result(spec.id)).status is JobStatus.SUCCEEDED
        await fleet.check_events(spec.id, spec.stopping.max_new_tokens)  # no index twice: ran once
        assert (await fleet.record(spec.id))[RecordField.ATTEMPTS] == "1"
    owners = {(await fleet.record(s.id))[RecordField.WORKER] for s in specs}
    assert owners == {"w0", "w1"}
    assert await fleet.pending() == 0 and await fleet.queued() == 0


async def test_a_low_job_on_the_last_shard_resumes_after_its_worker_is_killed(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    fleet.use_shards(3)
    fleet.start("w0", "w1")
    await fleet.wait_ready()
    n = 300
    spec = make_spec(PROMPT, max_new_tokens=n, priority=-50)
    while fleet.keys.shard_of(spec.id) != 2:
        spec = spec.model_copy(update={"id": uuid.uuid4().hex})
    await fleet.submit(spec)
    await fleet.wait_events(spec.id, 40)
    (row,) = await fleet.pending_rows()
    assert row["stream"] == fleet.keys.jobs_stream(2, Band.LOW)
    victim = (await fleet.record(spec.id))[RecordField.WORKER]
    fleet.signal(victim, signal.SIGKILL)
    assert len(await fleet.events(spec.id)) < n, "the job finished before the kill: make it longer"

    assert (await fleet.result(spec.id)).status is JobStatus.SUCCEEDED
    await fleet.check_events(spec.id, n)
    record = await fleet.record(spec.id)
    survivor = {"w0": "w1", "w1": "w0"}[victim]
    assert (record[RecordField.WORKER], record[RecordField.ATTEMPTS]) == (survivor, "2")
    assert await fleet.pending() == 0 and await fleet.queued() == 0
