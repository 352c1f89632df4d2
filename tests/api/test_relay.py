"""The relay against a real Redis: backlog then live, no gap, no duplicate, resumable."""

from __future__ import annotations

import asyncio

from api.relay import Relay
from schemas.job import EventToken, JobEvent, JobResult, JobStatus, RecordField
from schemas.keys import Keys
from worker.publisher import InFlight, Publisher
from worker.scripts import Scripts

KEYS = Keys("relaytest")


def worker_publisher(redis) -> Publisher:  # type: ignore[no-untyped-def]
    return Publisher(redis, KEYS, "w1", Scripts(redis), result_ttl=60, event_stream_maxlen=1000)


async def owned(redis, job_id: str) -> InFlight:  # type: ignore[no-untyped-def]
    """A job as a worker holds it: the record names the worker, which alone may publish its events."""
    await redis.hset(KEYS.job(job_id), RecordField.WORKER, "w1")
    return InFlight(job_id, entry_id="0-1", created_at=0.0)


def token_event(i: int, final: bool = False) -> JobEvent:
    result = JobResult(status=JobStatus.SUCCEEDED, generated_text="x" * (i + 1), finish_reason="length")
    return JobEvent(index=i, token=EventToken(id=i, text="x"), final=final, result=result if final else None)


async def collect(relay: Relay, job_id: str, after: int = -1) -> list[JobEvent]:
    return [e async for e in relay.events(job_id, after=after) if e is not None]


async def test_backlog_then_live_without_gap_or_duplicate(redis) -> None:  # type: ignore[no-untyped-def]
    publisher = worker_publisher(redis)
    relay = Relay(redis, KEYS)
    await relay.start()
    try:
        job = await owned(redis, "j1")
        await publisher.publish([(job, token_event(i)) for i in range(3)])  # before the client
        reader = asyncio.create_task(collect(relay, "j1"))
        await asyncio.sleep(0.2)
        for i in range(3, 10):
            await publisher.publish([(job, token_event(i, final=i == 9))])
        events = await asyncio.wait_for(reader, 10)
        assert [e.index for e in events] == list(range(10))
        assert events[-1].final and events[-1].result is not None
        assert relay.num_clients == 0
    finally:
        await relay.stop()


async def test_resume_after_k_also_after_the_job_finished(redis) -> None:  # type: ignore[no-untyped-def]
    publisher = worker_publisher(redis)
    relay = Relay(redis, KEYS)
    await relay.start()
    try:
        job = await owned(redis, "j2")
        await publisher.publish([(job, token_event(i, final=i == 5)) for i in range(6)])
        events = await asyncio.wait_for(collect(relay, "j2", after=2), 10)
        assert [e.index for e in events] == [3, 4, 5]
        assert await redis.ttl(KEYS.events("j2")) > 0  # finished: every key of the job has a TTL
        assert await redis.ttl(KEYS.job("j2")) > 0
    finally:
        await relay.stop()


async def test_slow_client_catches_up_from_the_stream(redis, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import api.relay as relay_module

    monkeypatch.setattr(relay_module, "CLIENT_BUFFER", 2)
    publisher = worker_publisher(redis)
    relay = Relay(redis, KEYS)
    await relay.start()

    async def slow_reader() -> list[int]:
        seen: list[int] = []
        async for event in relay.events("j3"):
            if event is None:
                continue
            seen.append(event.index)
            if len(seen) == 1:
                await asyncio.sleep(0.5)  # meanwhile 19 events arrive for a buffer of 2
        return seen

    try:
        job = await owned(redis, "j3")
        reader = asyncio.create_task(slow_reader())
        await asyncio.sleep(0.2)
        for i in range(20):
            await publisher.publish([(job, token_event(i, final=i == 19))])
        assert await asyncio.wait_for(reader, 10) == list(range(20))
    finally:
        await relay.stop()
