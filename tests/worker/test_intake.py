"""A worker in this process against the real Redis: how it decides each job it takes — resume from
the event stream, already finished, cancelled or expired in the queue, unreadable, refused by the
engine — and the ownership fence. What a dead worker leaves behind is written here by hand, exactly
as the worker's own scripts write it."""

from __future__ import annotations

import asyncio
import time

from conveyor.jobqueue.keys import WORKER_GROUP, event_entry_id
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.wire.event_batch import load_events
from conveyor.wire.job import JobEvent, JobStatus, RecordField
from conveyor.worker.owned import InFlight
from conveyor.worker.publisher import Publisher

PROMPT = [101, 2024, 318, 257, 1332, 13]


async def dead_worker_takes(local, job_id: str, events: list[JobEvent]) -> None:  # type: ignore[no-untyped-def]
    """A worker 'dead' read the job, wrote `events` to its event stream, and died."""
    stream = local.keys.stream_of(job_id, 0)
    reply = await local.redis.xreadgroup(WORKER_GROUP, "dead", {stream: ">"}, count=1)
    assert reply and reply[0][1][0][1]["id"] == job_id
    await local.redis.hset(local.keys.job(job_id), mapping={
        RecordField.WORKER: "dead", RecordField.STATUS: JobStatus.RUNNING.value,
        RecordField.STARTED_AT: time.time(),
    })
    for event in events:
        await local.redis.xadd(local.keys.events(job_id), {"e": event.model_dump_json(exclude_none=True)},
                               id=event_entry_id(event.index))


async def test_a_reclaimed_job_resumes_exactly_where_its_event_stream_ends(local, make_spec) -> None:  # type: ignore[no-untyped-def]
    n, k = 40, 15
    async with local.worker():
        reference_id = await local.submit(make_spec(PROMPT, max_new_tokens=n))
        reference = await local.result(reference_id)
        reference_events = await local.check_events(reference_id, n)
    assert reference.status is JobStatus.SUCCEEDED

    job_id = await local.submit(make_spec(PROMPT, max_new_tokens=n))
    await dead_worker_takes(local, job_id, reference_events[:k])  # k tokens written, the last unpublished
    pubsub = local.redis.pubsub()
    await pubsub.subscribe(local.keys.channel(job_id))  # a live subscriber that has seen up to k-2
    await local.redis.hset(local.keys.job(job_id), RecordField.WATCHED, 1)  # as the api's relay marks it
    await local.wait_idle_past_lease(local.settings.job_lease_ms)  # the dead worker's lease ran out
    async with local.worker():
        result = await local.result(job_id)
    live: list[int] = []
    while (message := await pubsub.get_message(timeout=0.2)) is not None:
        if message["type"] == "message":
            live += [event.index for event in load_events(message["data"])]
    await pubsub.aclose()

    assert result.status is JobStatus.SUCCEEDED
    assert result.generated_text == reference.generated_text  # greedy: as if never interrupted
    events = await local.check_events(job_id, n)
    assert [e.token.id for e in events] == [e.token.id for e in reference_events]  # type: ignore[union-attr]
    assert live == list(range(k - 1, n)), "the last written event is published again, then the rest"
    record = await local.record(job_id)
    assert record[RecordField.ATTEMPTS] == "2" and record[RecordField.WORKER] == "local"
    assert await local.pending() == 0
    assert await local.redis.xlen(local.keys.dead_letter_stream) == 0


async def test_a_finished_job_whose_ack_was_lost_is_only_acknowledged(local, make_spec) -> None:  # type: ignore[no-untyped-def]
    n = 5
    async with local.worker():
        reference_id = await local.submit(make_spec(PROMPT, max_new_tokens=n))
        await local.result(reference_id)
        events = await local.events(reference_id)
    job_id = await local.submit(make_spec(PROMPT, max_new_tokens=n))
    await dead_worker_takes(local, job_id, [])
    # The dead worker wrote every event and the final record, then died before XACK.
    publisher = Publisher(local.redis, local.keys, "dead", Scripts(local.redis), 60, 1000)
    await publisher.publish([(InFlight(job_id, "0-1", time.time()), e) for e in events])
    before = await local.record(job_id)
    await local.wait_idle_past_lease(local.settings.job_lease_ms)
    async with local.worker():
        deadline = time.monotonic() + 60
        while await local.pending():  # reclaimed, found finished, acknowledged
            assert time.monotonic() < deadline, "the finished job's entry was never acknowledged"
            await asyncio.sleep(0.05)
    after = await local.record(job_id)
    assert after[RecordField.RESULT] == before[RecordField.RESULT]
    assert after[RecordField.FINISHED_AT] == before[RecordField.FINISHED_AT]  # not run again
    await local.check_events(job_id, n)
    assert await local.queued() == 0  # acknowledged entries are deleted


async def test_cancelled_or_expired_in_the_queue_never_starts(local, make_spec) -> None:  # type: ignore[no-untyped-def]
    cancelled = await local.submit(make_spec(PROMPT, max_new_tokens=50))
    # The api's cancel flag landed before any worker read the job (the api had not ended it yet).
    await local.redis.hset(local.keys.job(cancelled), RecordField.CANCEL, time.time())
    expired = await local.submit(make_spec(PROMPT, max_new_tokens=50, deadline=time.time() - 1))
    async with local.worker():
        results = [await local.result(cancelled), await local.result(expired)]
    assert [r.status for r in results] == [JobStatus.CANCELLED, JobStatus.EXPIRED]
    for job_id, result in zip((cancelled, expired), results, strict=True):
        assert result.usage is not None and result.usage.completion_tokens == 0
        assert RecordField.STARTED_AT not in await local.record(job_id)
        events = await local.events(job_id)
        assert [(e.index, e.final, e.token) for e in events] == [(0, True, None)]
    assert await local.pending() == 0


async def test_unreadable_entries_go_to_the_dead_letter_stream(local, make_spec) -> None:  # type: ignore[no-untyped-def]
    await local.redis.xadd(local.keys.stream_of("junk", 0), {"id": "junk", "spec": "{not json"})
    orphan = make_spec(PROMPT, priority=-100)  # in the (batch) stream without its record
    await local.redis.xadd(local.keys.stream_of(orphan.id, -100),
                           {"id": orphan.id, "spec": orphan.model_dump_json()})
    async with local.worker():
        fine = await local.submit(make_spec(PROMPT))
        assert (await local.result(fine)).status is JobStatus.SUCCEEDED  # the worker keeps serving
    dead = await local.redis.xrange(local.keys.dead_letter_stream)
    reasons = {fields["id"]: fields["reason"] for _id, fields in dead}
    assert set(reasons) == {"junk", orphan.id}
    assert "no valid job spec" in reasons["junk"] and "record is gone" in reasons[orphan.id]
    assert not await local.redis.exists(local.keys.job(orphan.id))  # no record made up for it
    assert await local.pending() == 0


async def test_a_job_the_engine_refuses_fails_with_its_reason(local, make_spec) -> None:  # type: ignore[no-untyped-def]
    engine = local.engine(num_blocks=8)  # 128 tokens of KV: a 500-token job can never fit
    async with local.worker(engine=engine):
        too_big = await local.submit(make_spec(PROMPT, max_new_tokens=500))
        result = await local.result(too_big)
        fine = await local.submit(make_spec(PROMPT, max_new_tokens=5))
        assert (await local.result(fine)).status is JobStatus.SUCCEEDED
    assert result.status is JobStatus.FAILED
    assert result.error is not None and "lower max_new_tokens" in result.error


async def test_a_worker_that_lost_a_job_cannot_write_to_it(local) -> None:  # type: ignore[no-untyped-def]
    await local.redis.hset(local.keys.job("j"), mapping={RecordField.WORKER: "new",
                                                          RecordField.STATUS: "running"})
    stale = Publisher(local.redis, local.keys, "old", Scripts(local.redis), 60, 1000)
    job = InFlight("j", "0-1", time.time())
    published = await stale.publish([(job, JobEvent(index=0, token={"id": 1, "text": "a"}))])
    assert published.lost == [job] and not published.ended
    assert not await local.redis.exists(local.keys.events("j"))
    owner = Publisher(local.redis, local.keys, "new", Scripts(local.redis), 60, 1000)
    event = JobEvent(index=0, token={"id": 1, "text": "a"})
    await owner.publish([(job, event)])
    await owner.publish([(job, event)])  # a retried pipeline: the index is refused the second time
    assert [e.index for e in await local.events("j")] == [0]


async def test_heartbeat_says_who_the_worker_is_and_how_full(local, make_spec) -> None:  # type: ignore[no-untyped-def]
    async with local.worker("w-info") as worker:
        job_id = await local.submit(make_spec(PROMPT, max_new_tokens=3000))
        await local.wait_events(job_id, 10)
        deadline = time.monotonic() + 60
        while (busy := await local.info("w-info")).load.running == 0:  # a heartbeat from while it runs
            assert time.monotonic() < deadline, f"no heartbeat shows the running job: {busy}"
            await asyncio.sleep(0.02)
        ttl = await local.redis.pttl(local.keys.worker("w-info"))
        worker.thread.abort(job_id)
        await local.result(job_id)
    assert (busy.id, busy.device, busy.dtype, busy.kv_blocks) == ("w-info", "cpu", "float32", 1024)
    assert busy.jobs == 1 and busy.load.running == 1 and busy.load.blocks_used > 0
    assert 0 < ttl <= local.settings.job_lease_ms
    assert not await local.redis.exists(local.keys.worker("w-info"))  # a clean stop says goodbye
