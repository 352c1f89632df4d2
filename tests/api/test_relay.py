"""The relay against a real Redis: backlog then live, no gap, no duplicate, resumable."""

from __future__ import annotations

import asyncio

from api.relay import Relay
from schemas.job import EventToken, JobEvent, JobResult, JobStatus
from schemas.keys import Keys
from worker.publisher import InFlight, Publisher

KEYS = Keys("relaytest")


def token_event(i: int, final: bool = False) -> JobEvent:
    result = JobResult(status=JobStatus.SUCCEEDED, generated_text="x" * (i + 1), finish_reason="length")
    return JobEvent(index=i, token=EventToken(id=i, text="x"), final=final, result=result if final else None)


async def collect(relay: Relay, job_id: str, after: int = -1) -> list[JobEvent]:
    return [e async for e in relay.events(job_id, after=after) if e is not None]


async def test_backlog_then_live_without_gap_or_duplicate(redis) -> None:  # type: ignore[no-untyped-def]
    publisher = Publisher(redis, KEYS, result_ttl=60, event_stream_maxlen=1000)
    relay = Relay(redis, KEYS)
    await relay.start()
    try:
        inflight: dict[str, InFlight] = {}
        await publisher.publish([("j1", token_event(i)) for i in range(3)], inflight)  # before the client
        reader = asyncio.create_task(collect(relay, "j1"))
        await asyncio.sleep(0.2)
        for i in range(3, 10):
            await publisher.publish([("j1", token_event(i, final=i == 9))], inflight)
        events = await asyncio.wait_for(reader, 10)
        assert [e.index for e in events] == list(range(10))
        assert events[-1].final and events[-1].result is not None
        assert relay.num_clients == 0
    finally:
        await relay.stop()


async def test_resume_after_k_also_after_the_job_finished(redis) -> None:  # type: ignore[no-untyped-def]
    publisher = Publisher(redis, KEYS, result_ttl=60, event_stream_maxlen=1000)
    relay = Relay(redis, KEYS)
    await relay.start()
    try:
        await publisher.publish([("j2", token_event(i, final=i == 5)) for i in range(6)], {})
        events = await asyncio.wait_for(collect(relay, "j2", after=2), 10)
        assert [e.index for e in events] == [3, 4, 5]
        assert await redis.ttl(KEYS.events("j2")) > 0  # finished: every key of the job has a TTL
        assert await redis.ttl(KEYS.job("j2")) > 0
    finally:
        await relay.stop()


async def test_slow_client_catches_up_from_the_stream(redis, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import api.relay as relay_module

    monkeypatch.setattr(relay_module, "CLIENT_BUFFER", 2)
    publisher = Publisher(redis, KEYS, result_ttl=60, event_stream_maxlen=1000)
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
        reader = asyncio.create_task(slow_reader())
        await asyncio.sleep(0.2)
        for i in range(20):
            await publisher.publish([("j3", token_event(i, final=i == 19))], {})
        assert await asyncio.wait_for(reader, 10) == list(range(20))
    finally:
        await relay.stop()
