"""Redis failing is never a 500: while Redis is down, out of memory or read-only, every route that
needs it answers 503 with Retry-After in its dialect's shape, `/health` stays 200 and `/ready` says
why it is 503; once Redis is back the same api serves again. Real api process (no worker) against
a valkey-server of this module's own, which the tests stop and restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, OutOfMemoryError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from conveyor.api import errors
from conveyor.api.errors import ValidationError
from conveyor.api.jobpath.relay import StreamInterrupted
from conveyor.api.responses.sse import guarded, sse
from conveyor.api.routes import jobs as async_jobs
from conveyor.api.routes import openai, tgi
from conveyor.launcher.redis_server import EmbeddedRedis, free_port
from tests.conftest import RunningService, start_service, stop_service

TGI_BODY = {"inputs": "Hello", "parameters": {"max_new_tokens": 3}}
CHAT_BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
SUBMITS = [("/generate", TGI_BODY), ("/generate_stream", TGI_BODY), ("/", TGI_BODY),
           ("/v1/chat/completions", CHAT_BODY), ("/v1/chat/completions", {**CHAT_BODY, "stream": True}),
           ("/v1/completions", {"prompt": "hi", "max_tokens": 3}), ("/v1/jobs", TGI_BODY),
           ("/v1/jobs", CHAT_BODY)]


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis-down")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, own_redis: EmbeddedRedis,  # type: ignore[no-untyped-def]
        tiny_model_dir) -> Iterator[RunningService]:
    running = start_service(tmp_path_factory.mktemp("redis-down-api"), own_redis.url,
                            {"CONVEYOR_MODEL": str(tiny_model_dir)}, workers=0)
    yield running
    stop_service(running)


def assert_unavailable(r: httpx.Response, path: str) -> None:
    assert r.status_code == 503, (path, r.status_code, r.text)
    assert int(r.headers["retry-after"]) > 0, path
    if path.startswith("/v1"):
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "unavailable"), error
        message = error["message"]
    else:
        assert r.json()["error_type"] == "unavailable", r.json()
        message = r.json()["error"]
    assert "Redis" in message and "retry in" in message, message


def submit(api: RunningService, path: str, body: dict) -> httpx.Response:
    return httpx.post(api.base_url + path, json=body, timeout=30)


def test_redis_down_is_503_on_every_route_and_the_api_recovers(api: RunningService,
                                                               own_redis: EmbeddedRedis) -> None:
    job = submit(api, "/v1/jobs", TGI_BODY)
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    own_redis.stop()
    try:
        for path, body in SUBMITS:
            assert_unavailable(submit(api, path, body), path)
        for method, path in [("GET", f"/v1/jobs/{job_id}"), ("GET", f"/v1/jobs/{job_id}/events"),
                             ("DELETE", f"/v1/jobs/{job_id}"), ("GET", "/v1/jobs"), ("GET", "/queue")]:
            assert_unavailable(httpx.request(method, api.base_url + path, timeout=30), path)
        assert httpx.get(api.base_url + "/health", timeout=30).status_code == 200
        ready = httpx.get(api.base_url + "/ready", timeout=30)
        assert ready.status_code == 503 and ready.json()["redis"] is False, ready.text
        info = httpx.get(api.base_url + "/info", timeout=30)  # served from the settings meanwhile
        assert info.status_code == 200 and info.json()["model_dtype"] == "auto", info.text
        metrics = httpx.get(api.base_url + "/metrics", timeout=30)
        assert metrics.status_code == 200 and "\nconveyor_jobs{" not in metrics.text  # no stale queue
        assert f'tgi_request_failure{{err="unavailable"}} {len(SUBMITS)}.0' in metrics.text.splitlines()
    finally:
        own_redis.start()
    again = submit(api, "/v1/jobs", TGI_BODY)  # the same api, reconnected: no restart needed
    assert again.status_code == 202, again.text
    for done in (job_id, again.json()["id"]):
        r = httpx.delete(api.base_url + f"/v1/jobs/{done}", timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
    assert "Redis failed on POST /generate: ConnectionError" in (api.log_dir / "api.log").read_text()


@pytest.mark.parametrize("fault", ["oom", "readonly"])
def test_redis_refusing_writes_is_503(api: RunningService, own_redis: EmbeddedRedis, fault: str) -> None:
    """An out-of-memory or read-only Redis (a replica after a failover) answers errors, not silence:
    503 too, and no job is half-written."""
    with Redis.from_url(own_redis.url) as redis:
        if fault == "oom":
            redis.config_set("maxmemory", 1)
        else:
            redis.execute_command("REPLICAOF", "127.0.0.1", free_port())  # a primary that is not there
        try:
            for path, body in SUBMITS[:1] + SUBMITS[3:4] + SUBMITS[6:7]:
                assert_unavailable(submit(api, path, body), path)
        finally:
            if fault == "oom":
                redis.config_set("maxmemory", 0)
            else:
                redis.execute_command("REPLICAOF", "NO", "ONE")
    assert submit(api, "/v1/jobs", TGI_BODY).status_code == 202


# --- the mapping itself, in-process -----------------------------------------------------------

FAULTS = [RedisConnectionError("Connection refused"), MaxConnectionsError("Too many connections"),
          RedisConnectionError("No connection available."), RedisTimeoutError("Timeout reading"),
          OutOfMemoryError("OOM command not allowed"), ReadOnlyError("You can't write against a replica"),
          ResponseError("LOADING"), ConnectionResetError(104, "reset"), TimeoutError()]


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    errors.install(app)

    @app.get("/v1/fault/{i}")
    @app.get("/fault/{i}")
    async def fault(i: int) -> None:
        raise FAULTS[i]

    @app.get("/bug")
    async def bug() -> None:
        raise KeyError("a bug of ours")

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("i", range(len(FAULTS)), ids=[type(f).__name__ for f in FAULTS])
def test_every_redis_fault_maps_to_503_in_the_dialect(client: TestClient, i: int) -> None:
    for path in (f"/fault/{i}", f"/v1/fault/{i}"):
        r = client.get(path)
        assert r.status_code == 503 and r.headers["retry-after"] == str(errors.UNAVAILABLE_RETRY_AFTER_S)
        body = r.json()
        shape = body["error"]["code"] if path.startswith("/v1") else body["error_type"]
        assert shape == "unavailable", body


def test_a_bug_is_still_500(client: TestClient) -> None:
    r = client.get("/bug")
    assert r.status_code == 500
    assert r.json() == {"error": "internal error: KeyError", "error_type": "internal"}


def _run(chunks, error_event) -> list[str]:  # type: ignore[no-untyped-def]
    async def collect() -> list[str]:
        return [c async for c in guarded(chunks, error_event)]

    return asyncio.run(collect())


def _failing(exc: BaseException):  # type: ignore[no-untyped-def]
    async def chunks():  # type: ignore[no-untyped-def]
        yield sse("{}", 0)
        raise exc

    return chunks()


def test_a_stream_that_loses_redis_ends_with_an_error_event_in_its_dialect() -> None:
    lost = RedisConnectionError("Error 111 connecting to 10.0.0.7:6379. Connection refused.")
    tgi_out = _run(_failing(lost), tgi.error_event)
    assert tgi_out[0] == "id: 0\ndata: {}\n\n" and len(tgi_out) == 2
    assert tgi_out[1].startswith("data: ") and "10.0.0.7" not in tgi_out[1]  # Redis's words stay in the log
    body = json.loads(tgi_out[1].removeprefix("data: "))
    assert body["error_type"] == "unavailable" and "Redis" in body["error"]
    [_, chunk] = _run(_failing(lost), openai.error_event)
    assert json.loads(chunk.removeprefix("data: "))["error"]["code"] == "unavailable"
    [_, chunk] = _run(_failing(StreamInterrupted("the stream ends here (resume with Last-Event-ID)")),
                      async_jobs.error_event)
    assert chunk.startswith("event: error\ndata: ") and "\nid:" not in chunk  # resumable after event 0
    error = json.loads(chunk.split("data: ", 1)[1])["error"]
    assert error["message"] == "the stream ends here (resume with Last-Event-ID)"


def test_a_refusal_found_mid_stream_is_an_error_event_too() -> None:
    refusal = ValidationError("Last-Event-ID 99 is past the last event", param="Last-Event-ID")
    [_, chunk] = _run(_failing(refusal), async_jobs.error_event)
    error = json.loads(chunk.split("data: ", 1)[1])["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "Last-Event-ID")
