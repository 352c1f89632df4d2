"""Cancel through the api's path (flag + control channel) against a worker process: the running
job ends `cancelled` with the text it had, and the worker's KV blocks are back to baseline."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.api.jobpath.store import JobStore
from conveyor.wire.job import JobStatus, RecordField

pytestmark = pytest.mark.slow


async def test_cancel_of_a_running_job_frees_its_blocks_and_keeps_its_text(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    fleet.start("w0")
    await fleet.wait_ready()
    baseline = await fleet.info("w0")
    n = 3000
    job_id = await fleet.submit(make_spec([101, 2024, 318, 257], max_new_tokens=n))
    await fleet.wait_events(job_id, 50)
    while (busy := await fleet.info("w0")).load.running == 0:  # a heartbeat from while it runs
        await asyncio.sleep(0.05)

    await JobStore(fleet.redis, fleet.keys, fleet.settings).cancel(job_id)
    give_up = asyncio.get_running_loop().time() + 60
    result = await fleet.result(job_id)

    assert result.status is JobStatus.CANCELLED
    events = await fleet.events(job_id)
    tokens = [e.token for e in events if e.token is not None]
    assert 50 <= len(tokens) < n
    assert result.usage is not None and result.usage.completion_tokens == len(tokens)
    assert result.generated_text == "".join(t.text for t in tokens if not t.special)  # partial text kept
    assert events[-1].final and events[-1].index == len(tokens)
    assert [e.index for e in events] == list(range(len(tokens) + 1))

    # The record's end is written before the worker reads the write's answer and lets the job go: a
    # heartbeat between the two still counts it, so wait for the first beat without it (or time out).
    finished_at = float((await fleet.record(job_id))[RecordField.FINISHED_AT])
    while (after := await fleet.info("w0")).heartbeat_at <= finished_at or after.jobs:
        if asyncio.get_running_loop().time() > give_up:
            break
        await asyncio.sleep(0.05)
    assert busy.load.blocks_used > baseline.load.blocks_used
    assert (after.load.blocks_used, after.load.running, after.jobs) == (baseline.load.blocks_used, 0, 0)
    assert await fleet.pending() == 0
