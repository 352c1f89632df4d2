"""Many models, one queue (issue 41), with real worker processes: a model's workers read only its
queue, prefix affinity places a job only on a worker of its model, and a job whose worker dies
resumes on another worker of the same model, never on one of another model."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.placement import decode_summary
from conveyor.jobqueue.prefix_hash import prefix_hashes
from conveyor.wire.job import JobStatus, RecordField

pytestmark = pytest.mark.slow

SYSTEM = [1000 + i for i in range(128)]  # 8 blocks of 16 tokens: a prefix worth placing
TWINS = {"m0", "m1"}


async def published(fleet, worker_id: str, prompt_ids: list[int], timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    """Until the worker's prefix summary holds the prompt's blocks."""
    chain = prefix_hashes(prompt_ids, 16)
    deadline = time.monotonic() + timeout
    while True:
        raw = await fleet.redis.get(fleet.keys.prefixes(worker_id))
        if raw and (summary := decode_summary(raw)) is not None and chain[-1] in summary.hashes:
            return
        assert time.monotonic() < deadline, f"{worker_id} never published the prefix\n{fleet.logs()}"
        await asyncio.sleep(0.05)


async def test_affinity_and_failover_stay_within_a_model(fleet, make_spec, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    fleet.env["CONVEYOR_MODELS"] = f"twin={tiny_model_dir}"
    fleet.settings = fleet.settings.model_copy(update={"models": f"twin={tiny_model_dir}"})
    fleet.start("w0")  # the default model
    fleet.start(*sorted(TWINS), CONVEYOR_WORKER_MODEL="twin", CONVEYOR_AFFINITY_WAIT_MS="3000")
    await fleet.wait_ready()
    assert (await fleet.info("m0")).model == "twin"
    store = JobStore(fleet.redis, fleet.keys, fleet.settings)

    # The twin worker that ran a prompt holds its prefix: twin jobs with it go there...
    first = make_spec(SYSTEM + [200], model="twin")
    await store.submit(first)
    assert (await fleet.result(first.id)).status is JobStatus.SUCCEEDED
    holder = (await fleet.record(first.id))[RecordField.WORKER]
    assert holder in TWINS
    await published(fleet, holder, first.prompt_ids)
    await store.placement_for("twin").refresh()
    await store.placement.refresh()
    assert set(store.placement_for("twin")._summaries) <= TWINS
    assert set(store.placement._summaries) <= {"w0"}  # the default model's placement sees its own only
    again = make_spec(SYSTEM + [201], model="twin")
    await store.submit(again)
    await fleet.result(again.id)
    assert (await fleet.record(again.id))[RecordField.WORKER] == holder
    # ... and a default-model job with the same prompt runs on the default model's worker.
    default = make_spec(SYSTEM + [202])
    await store.submit(default)
    assert (await fleet.result(default.id)).status is JobStatus.SUCCEEDED
    assert (await fleet.record(default.id))[RecordField.WORKER] == "w0"

    # A twin job whose worker dies resumes on the other twin worker, not on w0.
    n = 600
    long = make_spec([101, 2024, 318, 257, 1332, 13], max_new_tokens=n, model="twin")
    await store.submit(long)
    await fleet.wait_events(long.id, 100)
    victim = (await fleet.record(long.id))[RecordField.WORKER]
    assert victim in TWINS
    fleet.signal(victim, signal.SIGKILL)
    assert len(await fleet.events(long.id)) < n, "the job finished before the kill: make it longer"
    assert (await fleet.result(long.id)).status is JobStatus.SUCCEEDED
    record = await fleet.record(long.id)
    assert (record[RecordField.WORKER], record[RecordField.ATTEMPTS]) == ((TWINS - {victim}).pop(), "2")
    await fleet.check_events(long.id, n)
