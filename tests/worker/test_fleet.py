"""Worker processes sharing one consumer group: load split by capacity, every job exactly once,
nothing left behind, and a graceful SIGTERM that loses nothing."""

from __future__ import annotations

import asyncio
import random
import signal
import time

import pytest

from conveyor.wire.job import JobStatus, RecordField

pytestmark = pytest.mark.slow


async def test_200_jobs_on_two_workers_each_run_exactly_once(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    result_ttl = 3
    fleet.start("w0", "w1", CONVEYOR_RESULT_TTL=str(result_ttl))
    await fleet.wait_ready()
    rng = random.Random(4)
    specs = [make_spec([rng.randrange(1000, 40000) for _ in range(rng.randint(3, 24))],
                       max_new_tokens=rng.randint(2, 12)) for _ in range(200)]
    for spec in specs:  # at once: one after the other, without waiting for any result
        await fleet.submit(spec)
    results = [await fleet.result(spec.id) for spec in specs]

    assert [r.status for r in results] == [JobStatus.SUCCEEDED] * 200
    owners = []
    for spec, result in zip(specs, results, strict=True):
        n = spec.stopping.max_new_tokens
        assert result.usage is not None and result.usage.completion_tokens == n
        assert result.timings is not None and result.timings.ttft_s is not None
        await fleet.check_events(spec.id, n)  # one final event: the job ran once
        record = await fleet.record(spec.id)
        assert record[RecordField.ATTEMPTS] == "1"
        assert {RecordField.STARTED_AT, RecordField.FIRST_TOKEN_AT, RecordField.FINISHED_AT} <= record.keys()
        owners.append(record[RecordField.WORKER])
    assert set(owners) == {"w0", "w1"}, f"one worker took everything: {len(owners)} jobs"
    assert await fleet.pending() == 0
    assert await fleet.queued() == 0  # acknowledged entries are deleted

    keys = [key async for key in fleet.redis.scan_iter(f"{fleet.keys.prefix}:*")]
    ttls = {k: await fleet.redis.ttl(k) for k in keys if not fleet.keys.untimed(k)}
    assert [k for k, ttl in ttls.items() if ttl == -1] == []  # -2: expired already
    # A job's own keys live result_ttl; the indexes over jobs (tenant listing, admission) a day longer.
    job_keys = {k: ttl for k, ttl in ttls.items() if k.startswith(f"{fleet.keys.prefix}:job:")}
    assert job_keys and [k for k, ttl in job_keys.items() if ttl > result_ttl] == []
    deadline = time.monotonic() + result_ttl + 60  # Redis expires keys lazily and by sampling
    while left := [key async for key in fleet.redis.scan_iter(f"{fleet.keys.prefix}:job:*")]:
        assert time.monotonic() < deadline, f"{len(left)} job keys outlived result_ttl"
        await asyncio.sleep(0.2)


async def test_sigterm_under_load_loses_nothing(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    fleet.start("w0", "w1", CONVEYOR_DRAIN_TIMEOUT="1")
    await fleet.wait_ready()
    n = 1200  # ~4 s of decoding at the fastest seen here: four times what the drain allows
    specs = [make_spec([1000 + i, 2000 + i, 3000 + i], max_new_tokens=n) for i in range(16)]
    for spec in specs:
        await fleet.submit(spec)
    for spec in specs:
        await fleet.wait_events(spec.id, 20)
    on_w0 = [s.id for s in specs if (await fleet.record(s.id))[RecordField.WORKER] == "w0"]
    assert on_w0, "w0 took no job"

    fleet.signal("w0", signal.SIGTERM)  # 1 s to drain: too short for n tokens; the rest is handed over
    # The drain's own bounds (the read in flight 6 s, drain_timeout, publishing what the engine
    # computed 30 s) add up to about 40 s on a machine loaded enough: wait past them.
    assert await asyncio.to_thread(fleet.procs["w0"].wait, 60) == 0, fleet.logs()
    results = [await fleet.result(spec.id) for spec in specs]

    assert [r.status for r in results] == [JobStatus.SUCCEEDED] * len(specs)
    for spec in specs:
        await fleet.check_events(spec.id, n)
    resumed = [job_id for job_id in on_w0 if (await fleet.record(job_id))[RecordField.WORKER] == "w1"]
    assert resumed, "no job was handed from w0 to w1"
    assert await fleet.pending() == 0
    assert await fleet.redis.xlen(fleet.keys.dead_letter_stream) == 0  # a hand-off is not a failure
    assert not await fleet.redis.exists(fleet.keys.worker("w0"))


async def test_a_second_signal_exits_at_once_and_leaves_the_job_pending(fleet, make_spec) -> None:  # type: ignore[no-untyped-def]
    fleet.start("w0")
    await fleet.wait_ready()
    job_id = await fleet.submit(make_spec([101, 2024, 318], max_new_tokens=1000))
    await fleet.wait_events(job_id, 20)

    fleet.signal("w0", signal.SIGTERM)
    while not (await fleet.info("w0")).draining:  # two signals at once would arrive as one
        await asyncio.sleep(0.05)
    fleet.signal("w0", signal.SIGTERM)
    assert await asyncio.to_thread(fleet.procs["w0"].wait, 60) == 1, fleet.logs()  # not a drain (0)

    assert await fleet.pending() == 1  # still owned by w0: the next worker takes it after the lease
    assert (await fleet.record(job_id))[RecordField.STATUS] == JobStatus.RUNNING
    fleet.start("w1")
    assert (await fleet.result(job_id)).status is JobStatus.SUCCEEDED
    await fleet.check_events(job_id, 1000)
