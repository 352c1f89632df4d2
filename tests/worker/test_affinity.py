"""Prefix-affinity placement with real worker processes (docs/design.md §3): a job whose prefix a
worker holds is queued on that worker's own stream and runs there; if that worker is stopped or
dead, another takes the job within `affinity_wait_ms` plus one read; a job placed there that the dead
worker had started is resumed elsewhere; every job runs once; the fleet cleans up a dead worker's
empty streams."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.placement import decode_summary
from conveyor.jobqueue.prefix_hash import prefix_hashes
from conveyor.wire.heartbeat import WorkerInfo
from conveyor.wire.job import JobStatus, RecordField
from conveyor.worker.queue_reader import READ_BLOCK_MS

pytestmark = pytest.mark.slow

WAIT_MS = 300
SYSTEM = [1000 + i for i in range(128)]  # 8 blocks of 16 tokens: a shared "system prompt"


def prompt(i: int) -> list[int]:
    return SYSTEM + [200 + i, 300 + i, 400 + i]


async def holding(fleet, store: JobStore, worker_id: str, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    """Until the worker's summary shows the system prompt's blocks and the api has read it."""
    chain = prefix_hashes(prompt(0), 16)
    deadline = time.monotonic() + timeout
    while True:
        raw = await fleet.redis.get(fleet.keys.prefixes(worker_id))
        summary = decode_summary(raw) if raw else None
        if summary is not None and chain[-1] in summary.hashes:
            await store.placement.refresh()
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{worker_id} never published the prefix\n{fleet.logs()}")
        await asyncio.sleep(0.05)


async def placed_on(fleet, worker_id: str) -> int:  # type: ignore[no-untyped-def]
    """Entries ever added to the worker's own stream (shard 0)."""
    return int((await fleet.redis.xinfo_stream(fleet.keys.own_stream(0, worker_id)))["entries-added"])


async def warm(fleet, make_spec, wait_ms: int = WAIT_MS, **env: str) -> tuple[JobStore, str, str]:  # type: ignore[no-untyped-def]
    """Two workers; one job with the system prompt: (api store, the worker holding it, the other)."""
    fleet.start("w0", "w1", CONVEYOR_AFFINITY_WAIT_MS=str(wait_ms), **env)
    await fleet.wait_ready()
    store = JobStore(fleet.redis, fleet.keys, fleet.settings)
    first = make_spec(prompt(0))
    await store.submit(first)
    await fleet.result(first.id)
    holder = (await fleet.record(first.id))[RecordField.WORKER]
    await holding(fleet, store, holder)
    return store, holder, {"w0": "w1", "w1": "w0"}[holder]


async def test_jobs_sharing_a_prefix_run_on_the_worker_that_holds_it(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    store, holder, other = await warm(fleet, make_spec, wait_ms=3000)  # the holder is never too late
    specs = [make_spec(prompt(i)) for i in range(1, 9)]
    for spec in specs:
        await store.submit(spec)
    results = [await fleet.result(spec.id) for spec in specs]
    assert all(r.status is JobStatus.SUCCEEDED for r in results)
    owners = [(await fleet.record(spec.id))[RecordField.WORKER] for spec in specs]
    assert owners == [holder] * len(specs), owners
    assert await placed_on(fleet, holder) == len(specs)
    assert all(r.usage is not None and r.usage.cached_tokens >= len(SYSTEM) for r in results)
    for spec in specs:
        await fleet.check_events(spec.id, spec.stopping.max_new_tokens)  # each ran once
    # A prompt no worker holds goes to the shared stream.
    fresh = make_spec([7000 + i for i in range(100)])
    await store.submit(fresh)
    await fleet.result(fresh.id)
    assert await placed_on(fleet, holder) == len(specs)
    assert (await fleet.record(fresh.id))[RecordField.WORKER] in {holder, other}


async def test_a_job_placed_on_a_stopped_worker_is_taken_by_another_within_the_wait(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    store, holder, other = await warm(fleet, make_spec)
    fleet.signal(holder, signal.SIGSTOP)
    try:
        spec = make_spec(prompt(1))
        submitted = time.time()
        await store.submit(spec)
        assert await placed_on(fleet, holder) == 1  # it was placed on the stopped worker
        await fleet.result(spec.id)
        record = await fleet.record(spec.id)
        waited = float(record[RecordField.STARTED_AT]) - submitted
    finally:
        fleet.signal(holder, signal.SIGCONT)
    assert record[RecordField.WORKER] == other
    assert record[RecordField.ATTEMPTS] == "1"
    # affinity_wait_ms + one read (a poll, its round trip and the engine's intake), with room for the
    # shared machine: far less than the lease (2 s) a reclaim would take, and it was never delivered.
    assert waited < (WAIT_MS + READ_BLOCK_MS) / 1000, waited
    await fleet.check_events(spec.id, spec.stopping.max_new_tokens)


async def test_a_holder_whose_engine_has_a_job_waiting_still_takes_its_own_jobs(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    # 4 prompt tokens a step: a long prompt keeps the holder's engine busy prefilling, and the job
    # behind it waiting for room (capacity 0: it reads nothing from the shared streams), for seconds.
    # First come, first served: shortest first would start the short job behind it at once.
    store, holder, other = await warm(fleet, make_spec, CONVEYOR_MAX_BATCH_PREFILL_TOKENS="4",
                                      CONVEYOR_ADMISSION_ORDER="arrival")
    view = dict(store.placement._summaries)

    async def place(spec) -> None:  # type: ignore[no-untyped-def]
        store.placement._summaries, store.placement._read_at = dict(view), time.monotonic()  # idle view
        await store.submit(spec)

    long = make_spec(SYSTEM + [5000 + i for i in range(3800)], max_new_tokens=1)
    behind = make_spec(prompt(1), max_new_tokens=1)
    await place(long)
    await place(behind)
    deadline = time.monotonic() + 60
    while WorkerInfo.model_validate_json(await fleet.redis.get(fleet.keys.worker(holder))).load.waiting < 1:
        assert time.monotonic() < deadline, f"the holder's engine never queued a job\n{fleet.logs()}"
        await asyncio.sleep(0.02)
    own = make_spec(prompt(2))
    await place(own)
    assert (await fleet.result(own.id)).status is JobStatus.SUCCEEDED
    record = await fleet.record(own.id)
    assert record[RecordField.WORKER] == holder  # not left to the other, to compute the prefix anew
    await fleet.result(long.id)
    # taken while the holder was still prefilling the long prompt (its engine queued it), not after
    long_first_token = float((await fleet.record(long.id))[RecordField.FIRST_TOKEN_AT])
    assert float(record[RecordField.STARTED_AT]) < long_first_token
    assert await placed_on(fleet, holder) == 3 and await placed_on(fleet, other) == 0


async def test_a_dead_holder_loses_nothing_and_its_streams_are_cleaned_up(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    store, holder, other = await warm(fleet, make_spec)
    n = 400
    running = make_spec(prompt(1), max_new_tokens=n)  # placed on the holder, started there
    await store.submit(running)
    await fleet.wait_events(running.id, 20)
    assert (await fleet.record(running.id))[RecordField.WORKER] == holder
    fleet.signal(holder, signal.SIGKILL)
    await store.placement.refresh()
    stale = dict(store.placement._summaries)  # the api's view until the dead worker's summary expires
    assert holder in stale
    late = make_spec(prompt(2))  # placed on the dead worker: its summary lives a lease more
    submitted = time.time()
    await store.submit(late)
    assert await placed_on(fleet, holder) == 2

    result = await fleet.result(late.id)
    record = await fleet.record(late.id)
    assert result.status is JobStatus.SUCCEEDED and record[RecordField.WORKER] == other
    assert float(record[RecordField.STARTED_AT]) - submitted < (WAIT_MS + READ_BLOCK_MS) / 1000
    resumed = await fleet.result(running.id)  # reclaimed from the dead worker's own stream
    record = await fleet.record(running.id)
    assert resumed.status is JobStatus.SUCCEEDED
    assert (record[RecordField.WORKER], record[RecordField.ATTEMPTS]) == (other, "2")
    await fleet.check_events(running.id, n)  # no gap, no duplicate
    await fleet.check_events(late.id, late.stopping.max_new_tokens)

    own = fleet.keys.own_stream(0, holder)
    deadline = time.monotonic() + 60
    while await fleet.redis.exists(own) or await fleet.redis.sismember(fleet.keys.owners(0), holder):
        assert time.monotonic() < deadline, f"the dead worker's stream was never removed\n{fleet.logs()}"
        await asyncio.sleep(0.1)
    # With its stream gone, a job is never queued where nobody reads, even by an api whose view is
    # older than that: the enqueue falls back to the shared stream.
    store.placement._summaries, store.placement._read_at = {holder: stale[holder]}, time.monotonic()
    spec = make_spec(prompt(3))
    await store.submit(spec)
    assert (await fleet.result(spec.id)).status is JobStatus.SUCCEEDED
    assert not await fleet.redis.exists(own)
