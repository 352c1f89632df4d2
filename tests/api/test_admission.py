"""Admission under bursts: the caps hold exactly with concurrent submits (two JobStores sharing one
Redis stand for two api processes), and the api's Redis pool waits for a connection instead of
failing; then a real api (no worker, so every admitted job stays outstanding) under a burst of
submits across the four routes: never past the cap, the rest 429 with Retry-After, no 5xx."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from conveyor.api.errors import Overloaded
from conveyor.api.jobpath.admission import WRITE_GRACE_S, Admission
from conveyor.api.jobpath.store import JobStore, new_job_id
from conveyor.api.redis_pool import api_redis, pool_size
from conveyor.jobqueue.keys import Keys
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.settings import Settings
from conveyor.wire.job import JobSpec, JobStatus, RecordField, StoppingSpec
from tests.api.conftest import auth, keys_of
from tests.conftest import RunningService, start_service, stop_service

KEYS = Keys("admissiontest")
CAP = 16


def spec(tenant: str = "alice", created_at: float | None = None) -> JobSpec:
    created = time.time() if created_at is None else created_at
    return JobSpec(id=new_job_id(), tenant=tenant, prompt_ids=[1, 2, 3],
                   stopping=StoppingSpec(max_new_tokens=4), created_at=created)


def settings(redis_url: str, **limits: object) -> Settings:
    return Settings(redis_url=redis_url, max_concurrent_requests=CAP, **limits)  # type: ignore[arg-type]


async def submit_all(stores: list[JobStore], specs: list[JobSpec]) -> list[bool]:
    async def one(store: JobStore, job: JobSpec) -> bool:
        try:
            await store.submit(job)
        except Overloaded:
            return False
        return True

    return await asyncio.gather(*(one(stores[i % len(stores)], s) for i, s in enumerate(specs)))


async def test_concurrent_submits_never_pass_the_cap(redis, redis_server: EmbeddedRedis) -> None:  # type: ignore[no-untyped-def]
    stores = [JobStore(redis, KEYS, settings(redis_server.url)) for _ in range(2)]  # two api processes
    specs = [spec() for _ in range(60)]
    admitted = await submit_all(stores, specs)
    assert sum(admitted) == CAP
    assert sum([await redis.xlen(s) for s in KEYS.jobs_streams]) == CAP  # a refused submit writes nothing
    assert await redis.zcard(KEYS.admitted) == CAP
    # Jobs that end free their places (seen when the set is full); the rest still count.
    done = [s for s, ok in zip(specs, admitted, strict=True) if ok][:5]
    for job in done:
        await redis.hset(KEYS.job(job.id), RecordField.STATUS, JobStatus.SUCCEEDED.value)
    assert sum(await submit_all(stores, [spec() for _ in range(20)])) == 5


async def test_the_tenant_cap_holds_and_a_refusal_counts_against_neither_cap(
        redis, redis_server: EmbeddedRedis) -> None:  # type: ignore[no-untyped-def]
    store = JobStore(redis, KEYS, settings(redis_server.url, max_concurrent_requests_per_tenant=3))
    assert sum(await submit_all([store], [spec("bob") for _ in range(20)])) == 3
    assert await redis.zcard(KEYS.admitted) == 3  # bob's 17 refusals took no global place
    assert sum(await submit_all([store], [spec("carol") for _ in range(20)])) == 3


async def test_each_model_has_its_own_cap_and_its_refusal_names_it(
        redis, redis_server: EmbeddedRedis) -> None:  # type: ignore[no-untyped-def]
    store = JobStore(redis, KEYS, settings(redis_server.url, max_concurrent_requests_per_model=3,
                                           served_model_name="chat"))
    small = [spec().model_copy(update={"model": "small"}) for _ in range(20)]
    assert sum(await submit_all([store], small)) == 3
    assert await redis.zcard(KEYS.admitted) == 3  # small's 17 refusals took no global place
    with pytest.raises(Overloaded) as refused:
        await store.submit(spec().model_copy(update={"model": "small"}))
    assert "'small'" in refused.value.message and "max_concurrent_requests_per_model" in refused.value.message
    assert refused.value.headers == {"Retry-After": "1"}
    assert sum(await submit_all([store], [spec() for _ in range(20)])) == 3  # the default model's own 3
    with pytest.raises(Overloaded, match="'chat'"):
        await store.submit(spec())


async def test_a_slot_a_dead_request_left_is_reclaimed(redis, redis_server: EmbeddedRedis) -> None:  # type: ignore[no-untyped-def]
    """Admitted, then the request died before writing its job: pruned once WRITE_GRACE_S has passed."""
    admission = Admission(redis, KEYS, settings(redis_server.url))
    for _ in range(CAP - 1):
        await admission.admit(spec())
    await admission.admit(spec(created_at=time.time() - WRITE_GRACE_S - 1))  # no record: it died
    await admission.admit(spec())
    with pytest.raises(Overloaded):
        await admission.admit(spec())


async def test_a_full_pool_waits_for_a_connection_then_fails_as_unavailable(
        redis_server: EmbeddedRedis) -> None:
    client = api_redis(settings(redis_server.url, redis_max_connections=2, redis_pool_timeout=0.2))
    pool = client.connection_pool
    try:
        held = [await pool.get_connection() for _ in range(2)]
        waiting = asyncio.create_task(client.ping())
        for _ in range(3):
            await asyncio.sleep(0)  # let it ask the pool: a non-blocking pool fails it right there
        assert not waiting.done()
        await pool.release(held.pop())
        assert await asyncio.wait_for(waiting, 30) is True
        held.append(await pool.get_connection())  # both busy again, for longer than the pool waits
        with pytest.raises(RedisConnectionError, match="No connection available"):  # mapped to 503
            await asyncio.wait_for(client.ping(), 30)
        for connection in held:
            await pool.release(connection)
    finally:
        await client.aclose()
    assert pool_size(Settings(max_concurrent_requests=100)) == 200
    assert pool_size(Settings(max_concurrent_requests=4)) == 32
    assert pool_size(Settings(redis_max_connections=7)) == 7


# --- a real api under a burst --------------------------------------------------------------------

BURST_PER_ROUTE = 20
GENERATE = {"inputs": "Hello", "parameters": {"max_new_tokens": 5}}
CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5, "stream": True}
ROUTES = [("/v1/jobs", GENERATE, "async"), ("/generate", GENERATE, "sync"),
          ("/generate_stream", GENERATE, "stream"), ("/v1/chat/completions", CHAT, "stream")]


@pytest.fixture(scope="module")
def burst_service(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
                  tiny_model_dir: Path, keys_file: Path) -> Iterator[RunningService]:
    """The api alone (no worker: an admitted job stays outstanding), cap 16, a Redis pool of 8."""
    running = start_service(tmp_path_factory.mktemp("burst"), services_redis.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir),
        "CONVEYOR_API_KEYS_FILE": str(keys_file),
        "CONVEYOR_MAX_CONCURRENT_REQUESTS": str(CAP),
        "CONVEYOR_REDIS_MAX_CONNECTIONS": "8",
    }, workers=0)
    yield running
    stop_service(running)


async def test_a_burst_across_the_routes_is_admitted_up_to_the_cap(burst_service: RunningService) -> None:
    answered: list[httpx.Response] = []  # every answer but an accepted sync or streaming request's
    streaming: list[str] = []  # streams that started (200): accepted, held open

    async def send(client: httpx.AsyncClient, path: str, body: dict, kind: str) -> None:
        async with client.stream("POST", path, json=body, headers=auth("alice")) as response:
            if kind == "stream" and response.status_code == 200:
                streaming.append(path)
                await asyncio.Event().wait()  # held open until the test ends
            await response.aread()  # an accepted sync request stays here: its job never runs
            answered.append(response)

    keys = keys_of(burst_service)
    total = BURST_PER_ROUTE * len(ROUTES)
    limits = httpx.Limits(max_connections=total + 10)
    async with (httpx.AsyncClient(base_url=burst_service.base_url, timeout=120, limits=limits) as client,
                Redis.from_url(burst_service.redis_url, decode_responses=True) as redis):
        tasks = [asyncio.create_task(send(client, path, body, kind))
                 for _ in range(BURST_PER_ROUTE) for path, body, kind in ROUTES]
        try:
            async def decided() -> int:
                """Requests whose admission is decided: answered, streaming, or a sync one whose job
                was written (each admitted job is one entry of the jobs stream: no worker reads it)."""
                written = sum([await redis.xlen(s) for s in keys.jobs_streams])
                accepted_async = sum(r.status_code == 202 for r in answered)
                return len(answered) + len(streaming) + (written - accepted_async - len(streaming))

            deadline = time.monotonic() + 120
            while await decided() < total:
                assert time.monotonic() < deadline, [r.status_code for r in answered]
                await asyncio.sleep(0.05)
            statuses = sorted(r.status_code for r in answered)
            assert not [s for s in statuses if s >= 500], statuses
            written = sum([await redis.xlen(s) for s in keys.jobs_streams])
            assert written == CAP, statuses  # exactly the cap, never more
            refused = [r for r in answered if r.status_code == 429]
            assert len(refused) == total - CAP, statuses
            assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
            assert {r.status_code for r in answered} <= {202, 429}
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
