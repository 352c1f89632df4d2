"""The relay against a real Redis: backlog then live, no gap, no duplicate, resumable; each test
asserts which path delivered the events (live pub/sub or the durable stream)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from conveyor.api.errors import ValidationError
from conveyor.api.jobpath.relay import Relay
from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.wire.job import EventToken, JobEvent, JobResult, JobStatus, RecordField
from conveyor.worker.publisher import InFlight, Publisher

KEYS = Keys("relaytest")
API = "relay-test"  # the relays' process id here: the follower the tests' jobs name


def worker_publisher(redis) -> Publisher:  # type: ignore[no-untyped-def]
    return Publisher(redis, KEYS, "w1", Scripts(redis), result_ttl=60, event_stream_maxlen=1000)


async def emit(publisher: Publisher, items: list[tuple[InFlight, JobEvent]]) -> None:
    """A followed job's events as a worker whose intervals are 0 sends them: written, then live."""
    await publisher.publish(items, items)


async def owned(redis, job_id: str) -> InFlight:  # type: ignore[no-untyped-def]
    """A job as a worker holds it: the record names the worker, which alone may publish its events."""
    await redis.hset(KEYS.job(job_id), RecordField.WORKER, "w1")
    return InFlight(job_id, entry_id="0-1", created_at=0.0, followers={API})


def token_event(i: int, final: bool = False) -> JobEvent:
    result = JobResult(status=JobStatus.SUCCEEDED, generated_text="x" * (i + 1), finish_reason="length")
    return JobEvent(index=i, token=EventToken(id=i, text="x"), final=final, result=result if final else None)


async def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition did not hold in time")
        await asyncio.sleep(0.01)


async def collect(relay: Relay, job_id: str, after: int = -1,
                  into: list[int] | None = None) -> list[JobEvent]:
    events = []
    async for batch in relay.batches(job_id, after=after):
        if batch is not None:
            assert batch, "a batch is never empty"
            events += batch
            if into is not None:
                into += [event.index for event in batch]
    return events


async def test_backlog_then_live_without_gap_or_duplicate(redis) -> None:  # type: ignore[no-untyped-def]
    publisher = worker_publisher(redis)
    relay = Relay(redis, KEYS, api_id=API)
    await relay.start()
    try:
        job = await owned(redis, "j1")
        await emit(publisher, [(job, token_event(i)) for i in range(3)])  # before the client
        seen: list[int] = []
        reader = asyncio.create_task(collect(relay, "j1", into=seen))
        await wait_until(lambda: seen == [0, 1, 2])  # the backlog is read: the client takes live events now
        assert relay.subscribed("j1")
        for i in range(3, 10):
            await emit(publisher, [(job, token_event(i, final=i == 9))])
        events = await asyncio.wait_for(reader, 10)
        assert [e.index for e in events] == list(range(10))
        assert events[-1].final and events[-1].result is not None
        assert (relay.stats.replayed, relay.stats.live, relay.stats.resyncs) == (3, 7, 0)
        assert relay.num_clients == 0
    finally:
        await relay.stop()


async def test_messages_queued_while_the_client_was_busy_come_as_one_batch(redis) -> None:  # type: ignore[no-untyped-def]
    """One batch per wake-up: what queued up while the client's last write was under way is rendered
    and written at once, not one token at a time."""
    publisher = worker_publisher(redis)
    relay = Relay(redis, KEYS, api_id=API)
    await relay.start()
    writing = asyncio.Event()  # the client's first write is under way until this is set
    batches: list[list[int]] = []

    async def client() -> None:
        async for batch in relay.batches("j-b"):
            if batch is not None:
                batches.append([event.index for event in batch])
                await writing.wait()

    try:
        job = await owned(redis, "j-b")
        reader = asyncio.create_task(client())
        await wait_until(lambda: relay.subscribed("j-b"))
        await emit(publisher, [(job, token_event(0))])
        await wait_until(lambda: batches == [[0]])
        for i in range(1, 6):  # five messages
            await emit(publisher, [(job, token_event(i, final=i == 5))])
        (listener,) = relay.router._clients["j-b"]  # the client's queue: five messages wait in it
        await wait_until(lambda: listener.queue.qsize() == 5)
        writing.set()
        await asyncio.wait_for(reader, 10)
        assert batches == [[0], [1, 2, 3, 4, 5]]
        assert (relay.stats.live, relay.stats.resyncs) == (6, 0)
    finally:
        await relay.stop()


async def test_resume_after_k_also_after_the_job_finished(redis) -> None:  # type: ignore[no-untyped-def]
    publisher = worker_publisher(redis)
    relay = Relay(redis, KEYS, api_id=API)
    await relay.start()
    try:
        job = await owned(redis, "j2")
        await emit(publisher, [(job, token_event(i, final=i == 5)) for i in range(6)])
        events = await asyncio.wait_for(collect(relay, "j2", after=2), 10)
        assert [e.index for e in events] == [3, 4, 5]
        assert (relay.stats.replayed, relay.stats.live) == (3, 0)
        assert await asyncio.wait_for(collect(relay, "j2", after=5), 10) == []  # saw the end: ends at once
        assert await asyncio.wait_for(collect(relay, "j2", after=999_999_999_999), 10) == []
        assert await redis.ttl(KEYS.events("j2")) > 0  # finished: every key of the job has a TTL
        assert await redis.ttl(KEYS.job("j2")) > 0
    finally:
        await relay.stop()


async def test_last_event_id_past_the_end_of_a_running_job_is_refused(redis) -> None:  # type: ignore[no-untyped-def]
    publisher = worker_publisher(redis)
    relay = Relay(redis, KEYS, api_id=API)
    await relay.start()
    try:
        with pytest.raises(ValidationError, match="none yet"):
            await relay.check_resume("j4", 999_999_999_999)
        job = await owned(redis, "j4")
        await emit(publisher, [(job, token_event(i)) for i in range(4)])
        await relay.check_resume("j4", 3)  # the last event: fine, the client waits for more
        for after in (4, 999_999_999_999, 2**80):
            with pytest.raises(ValidationError, match="its last index is 3") as refused:
                await relay.check_resume("j4", after)
            assert refused.value.param == "Last-Event-ID"
            with pytest.raises(ValidationError):  # the stream itself refuses too, at once
                await asyncio.wait_for(collect(relay, "j4", after=after), 10)
        assert relay.num_clients == 0
    finally:
        await relay.stop()


async def test_slow_client_catches_up_from_the_stream(redis, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import conveyor.jobqueue.pubsub.subscriptions as pubsub_module

    monkeypatch.setattr(pubsub_module, "CLIENT_BUFFER", 2)
    publisher = worker_publisher(redis)
    relay = Relay(redis, KEYS, api_id=API)
    await relay.start()
    published = asyncio.Event()

    async def slow_reader() -> list[int]:
        seen: list[int] = []
        async for batch in relay.batches("j3"):
            if batch is None:
                continue
            seen += [event.index for event in batch]
            if seen == [0]:
                await published.wait()  # meanwhile 19 messages arrive for a buffer of 2
        return seen

    try:
        job = await owned(redis, "j3")
        reader = asyncio.create_task(slow_reader())
        await wait_until(lambda: relay.subscribed("j3"))
        await emit(publisher, [(job, token_event(0))])
        await wait_until(lambda: relay.stats.live + relay.stats.replayed == 1)
        for i in range(1, 20):
            await emit(publisher, [(job, token_event(i, final=i == 19))])
        published.set()
        assert await asyncio.wait_for(reader, 10) == list(range(20))
        assert relay.stats.resyncs >= 1 and relay.stats.replayed >= 17  # the overflow path ran
    finally:
        await relay.stop()


async def test_a_final_event_written_between_the_backlogs_two_reads_is_delivered(redis) -> None:  # type: ignore[no-untyped-def]
    """The backlog reads after the client's index, then the stream's tail: a short job that ends
    between the two reads must not look ended to a client that never saw its events."""
    publisher = worker_publisher(redis)
    relay = Relay(redis, KEYS, api_id=API)
    job = await owned(redis, "j-race")
    real_xrange = redis.xrange
    raced = []

    async def xrange_then_the_job_ends(*args, **kwargs):  # type: ignore[no-untyped-def]
        entries = await real_xrange(*args, **kwargs)
        if not raced:  # the first read finds nothing; the job writes all of it right after
            raced.append(True)
            await emit(publisher, [(job, token_event(i, final=i == 2)) for i in range(3)])
        return entries

    redis.xrange = xrange_then_the_job_ends
    backlog = await relay.backlog("j-race", -1)
    assert raced and [e.index for e in backlog.events] == [0, 1, 2] and not backlog.ended


async def test_a_job_run_whole_between_the_tail_read_and_the_record_read_is_not_compacted(redis) -> None:  # type: ignore[no-untyped-def]
    """No event yet, then the job runs from its first token to its end before the record is read: the
    record's final event is there, but so are the per-token events, and a client gets all of them
    (a TGI stream renders a token-less final event as an error)."""
    publisher = worker_publisher(redis)
    relay = Relay(redis, KEYS, api_id=API)
    job = await owned(redis, "j-whole")
    real_xrevrange = redis.xrevrange
    raced = []

    async def tail_then_the_job_runs(*args, **kwargs):  # type: ignore[no-untyped-def]
        entries = await real_xrevrange(*args, **kwargs)
        if not raced:
            raced.append(True)
            await emit(publisher, [(job, token_event(i, final=i == 2)) for i in range(3)])
        return entries

    redis.xrevrange = tail_then_the_job_runs
    backlog = await relay.backlog("j-whole", -1)
    assert raced and [e.index for e in backlog.events] == [0, 1, 2] and not backlog.compacted
    assert backlog.events[0].token is not None


async def test_keepalives_off_with_zero_and_on_otherwise(redis) -> None:  # type: ignore[no-untyped-def]
    """sse_keepalive_s=0 (for clients such as `vllm bench serve` that choke on a lone comment): a silent
    stream yields no keep-alive pause, while a relay at 0.05 s yields some in the same silence."""
    publisher = worker_publisher(redis)
    off, on = Relay(redis, KEYS, api_id=API, keepalive_s=0), Relay(redis, KEYS, api_id=API, keepalive_s=0.05)
    await off.start()
    await on.start()
    try:
        job = await owned(redis, "j-ka")

        async def raw(relay: Relay, into: list[JobEvent | None]) -> None:
            async for batch in relay.batches("j-ka"):
                into += [None] if batch is None else batch

        silent_off: list[JobEvent | None] = []
        silent_on: list[JobEvent | None] = []
        readers = [asyncio.create_task(raw(off, silent_off)), asyncio.create_task(raw(on, silent_on))]
        await wait_until(lambda: off.subscribed("j-ka") and on.subscribed("j-ka"))
        await wait_until(lambda: silent_on.count(None) >= 3)  # the silence lasted 3 keep-alive intervals
        await emit(publisher, [(job, token_event(0, final=True))])
        await asyncio.wait_for(asyncio.gather(*readers), 10)
        assert [e.index for e in silent_off if e is not None] == [0]
        assert None not in silent_off
    finally:
        await off.stop()
        await on.stop()


async def test_an_end_never_published_live_is_found_at_the_next_keepalive(redis) -> None:  # type: ignore[no-untyped-def]
    """Whatever reached the event stream but not the relay's channel (an api that ended a queued job
    and died before its publish) ends the stream anyway: a client with nothing live for a keep-alive
    period looks at the stream."""
    publisher = worker_publisher(redis)
    relay = Relay(redis, KEYS, api_id=API, keepalive_s=0.2)
    await relay.start()
    try:
        job = await owned(redis, "j9")
        await emit(publisher, [(job, token_event(0))])
        seen: list[int] = []
        reader = asyncio.create_task(collect(relay, "j9", into=seen))
        await wait_until(lambda: seen == [0])
        await publisher.publish([(job, token_event(1, final=True))])  # written, never published live
        events = await asyncio.wait_for(reader, 10)
        assert [e.index for e in events] == [0, 1] and events[-1].final
        assert (relay.stats.replayed, relay.stats.live, relay.stats.resyncs) == (2, 0, 0)
    finally:
        await relay.stop()
