"""The relay when Redis fails under it: a real valkey-server of the test's own, SIGKILLed and
restarted on the same port from the same AOF, or paused with SIGSTOP; the relay alone, then a real
api process. Events are written by hand as a worker writes them (XADD to the job's event stream,
then PUBLISH)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from conveyor.api.jobpath.relay import Relay, StreamInterrupted
from conveyor.api.redis_pool import api_redis
from conveyor.jobqueue.keys import Keys, event_entry_id
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.settings import Settings
from conveyor.wire.event_batch import dump_live
from conveyor.wire.job import EventToken, JobEvent, JobResult, JobStatus, RecordField
from tests.api.conftest import auth, keys_of
from tests.api.test_relay import collect, wait_until
from tests.conftest import RunningService, start_service, stop_service

KEYS = Keys("relayfaults")
API = "relay-test"  # the relays' process id here: the channel the tests publish to


def event(i: int, final: bool = False) -> str:
    result = JobResult(status=JobStatus.SUCCEEDED, generated_text="x" * (i + 1), finish_reason="length")
    return JobEvent(index=i, token=EventToken(id=i, text="x"), final=final,
                    result=result if final else None).model_dump_json(exclude_none=True)


async def write(redis: Redis, job_id: str, indices: range, final_at: int = -1, live: bool = True,
                keys: Keys = KEYS, follower: str = API) -> None:
    """Events as the worker writes them, live to the api process `follower`; `live=False` leaves out
    the PUBLISH (what a relay that was not connected would have missed)."""
    for i in indices:
        data = event(i, final=i == final_at)
        pipe = redis.pipeline(transaction=False)
        pipe.xadd(keys.events(job_id), {"e": data}, id=event_entry_id(i))
        if live:
            pipe.publish(keys.live(follower), dump_live({job_id: f"[{data}]"}))
        await pipe.execute()


async def write_elsewhere(server: EmbeddedRedis, job_id: str, indices: range, keys: Keys = KEYS) -> None:
    """While the server is down, events reach the job's event stream through another server process
    on the same data (as a job goes on), never the pub/sub connection of a relay cut off from it."""
    other = EmbeddedRedis(server.data_dir, appendfsync="always").start()
    async with Redis.from_url(other.url, decode_responses=True) as writer:
        await write(writer, job_id, indices, live=False, keys=keys)
    other.stop()


async def poll(condition: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedRedis]:
    """A server of this test alone; `appendfsync always`, so a SIGKILL loses no write the test made."""
    running = EmbeddedRedis(tmp_path / "redis", appendfsync="always").start()
    yield running
    if running.process is not None and running.process.poll() is None:
        running.process.send_signal(signal.SIGCONT)
    running.stop()


def client(server: EmbeddedRedis) -> Redis:
    """The client the api makes (its pool, its one redial), for the relay's reads of the event stream."""
    return api_redis(Settings(redis_url=server.url))


def kill(server: EmbeddedRedis) -> None:
    assert server.process is not None
    server.process.kill()
    server.process.wait()


async def test_a_stream_resumes_after_redis_restarts(server: EmbeddedRedis) -> None:
    redis = client(server)
    relay = Relay(redis, KEYS, api_id=API, outage_timeout=120)
    await relay.start()
    seen: list[int] = []
    reader = asyncio.create_task(collect(relay, "r1", into=seen))
    try:
        await wait_until(lambda: relay.subscribed("r1"))
        await write(redis, "r1", range(3))
        await wait_until(lambda: seen == [0, 1, 2])
        kill(server)
        await wait_until(lambda: relay.subscriptions.down_since is not None)
        await write_elsewhere(server, "r1", range(3, 6))
        server.start()  # the same port and AOF
        await wait_until(lambda: seen == list(range(6)))  # 3-5: from the stream, after the reconnect
        assert relay.subscriptions.reconnects == 1 and relay.stats.resyncs >= 1
        await write(redis, "r1", range(6, 10), final_at=9)
        events = await asyncio.wait_for(reader, 30)
        assert [e.index for e in events] == list(range(10)) and events[-1].final
        assert relay.stats.live >= 4  # 6-9 came live again: the channel was subscribed anew
    finally:
        reader.cancel()
        await relay.stop()
        await redis.aclose()


async def test_an_outage_past_the_timeout_ends_the_stream_and_the_relay_recovers(
        server: EmbeddedRedis) -> None:
    redis = client(server)
    relay = Relay(redis, KEYS, api_id=API, outage_timeout=1.0)
    await relay.start()
    reader = asyncio.create_task(collect(relay, "r2"))
    try:
        await wait_until(lambda: relay.subscribed("r2"))
        await write(redis, "r2", range(2))
        kill(server)
        with pytest.raises(StreamInterrupted, match="has not answered"):
            await asyncio.wait_for(reader, 30)  # an error, not silence
        with pytest.raises(RedisConnectionError):  # a new stream is refused at once (503), not hung
            await asyncio.wait_for(collect(relay, "r3"), 30)
        server.start()
        await wait_until(lambda: relay.subscriptions.down_since is None)
        later = asyncio.create_task(collect(relay, "r4"))
        await wait_until(lambda: relay.subscribed("r4"))
        await write(redis, "r4", range(3), final_at=2)
        assert [e.index for e in await asyncio.wait_for(later, 30)] == [0, 1, 2]
    finally:
        reader.cancel()
        await relay.stop()
        await redis.aclose()


async def test_a_paused_redis_is_noticed_and_the_stream_ends_with_an_error(
        server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    import conveyor.jobqueue.pubsub.subscriptions as pubsub_module

    for name in ("PING_S", "PONG_TIMEOUT_S", "SOCKET_TIMEOUT_S"):
        monkeypatch.setattr(pubsub_module, name, 0.3)
    redis = client(server)
    relay = Relay(redis, KEYS, api_id=API, outage_timeout=1.0)
    await relay.start()
    reader = asyncio.create_task(collect(relay, "r5"))
    assert server.process is not None
    try:
        await wait_until(lambda: relay.subscribed("r5"))
        server.process.send_signal(signal.SIGSTOP)  # the socket stays open; nothing answers
        with pytest.raises(StreamInterrupted):
            await asyncio.wait_for(reader, 30)
        server.process.send_signal(signal.SIGCONT)
        await wait_until(lambda: relay.subscriptions.down_since is None)
        later = asyncio.create_task(collect(relay, "r6"))
        await wait_until(lambda: relay.subscribed("r6"))
        await write(redis, "r6", range(2), final_at=1)
        assert [e.index for e in await asyncio.wait_for(later, 30)] == [0, 1]
    finally:
        reader.cancel()
        await relay.stop()
        await redis.aclose()


async def test_the_relay_stops_while_its_redis_is_paused(server: EmbeddedRedis) -> None:
    """A shutdown (SIGTERM in a rolling update) while Redis does not answer: stop() returns rather
    than wait on the paused server (conveyor/jobqueue/pubsub/shutdown.py)."""
    redis = client(server)
    relay = Relay(redis, KEYS, api_id=API, outage_timeout=60.0)
    await relay.start()
    reader = asyncio.create_task(collect(relay, "r7"))
    assert server.process is not None
    try:
        await wait_until(lambda: relay.subscribed("r7"))
        server.process.send_signal(signal.SIGSTOP)
        stopping = asyncio.create_task(relay.stop())
        done, _ = await asyncio.wait({stopping}, timeout=60)  # a hang detector, not a speed bound
        assert stopping in done and stopping.exception() is None
    finally:
        server.process.send_signal(signal.SIGCONT)
        reader.cancel()
        await redis.aclose()


@pytest.fixture
def api_on_own_redis(server: EmbeddedRedis, tmp_path: Path, tiny_model_dir: Path,
                     keys_file: Path) -> Iterator[RunningService]:
    """A real api (no worker) on this test's own server."""
    (tmp_path / "api").mkdir()
    running = start_service(tmp_path / "api", server.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir), "CONVEYOR_API_KEYS_FILE": str(keys_file)}, workers=0)
    yield running
    stop_service(running)


async def test_an_api_streams_through_a_redis_restart_and_serves_on(
        server: EmbeddedRedis, api_on_own_redis: RunningService) -> None:
    """It used to send keep-alives forever, and fail every later request until restarted."""
    keys = keys_of(api_on_own_redis)
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 10}}
    seen: list[int] = []
    redis = client(server)
    base_url = api_on_own_redis.base_url
    async with httpx.AsyncClient(base_url=base_url, headers=auth("alice"), timeout=60) as http:
        job_id = (await http.post("/v1/jobs", json=body)).json()["id"]

        async def follow() -> None:
            async with http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    assert not line.startswith("event: error"), line
                    if line.startswith("id:"):
                        seen.append(int(line[3:]))

        async def subscribed() -> bool:  # the record names its follower, whose channel is subscribed
            follower = await redis.hget(keys.job(job_id), RecordField.WATCHED)
            [(_channel, listeners)] = await redis.pubsub_numsub(keys.live(follower or "-"))
            return listeners > 0

        reader = asyncio.create_task(follow())
        try:
            await poll(subscribed)
            follower = await redis.hget(keys.job(job_id), RecordField.WATCHED)
            await write(redis, job_id, range(3), keys=keys, follower=follower)
            await wait_until(lambda: seen == [0, 1, 2])
            kill(server)
            await write_elsewhere(server, job_id, range(3, 6), keys=keys)
            server.start()
            await wait_until(lambda: seen == list(range(6)), timeout=60)
            await poll(subscribed)  # subscribed anew, so the rest comes live
            await write(redis, job_id, range(6, 10), final_at=9, keys=keys, follower=follower)
            await asyncio.wait_for(reader, 60)
            assert seen == list(range(10))  # every index once, in order
            assert (await http.get(f"/v1/jobs/{job_id}")).status_code == 200
            assert (await http.post("/v1/jobs", json=body)).status_code == 202
        finally:
            reader.cancel()
            await redis.aclose()
