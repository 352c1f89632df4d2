"""A sync or streaming client that goes away cancels its job, and the worker frees its KV blocks."""

from __future__ import annotations

import time

import httpx
import pytest
from redis import Redis

from schemas.keys import Keys
from schemas.worker import WorkerInfo
from tests.api.conftest import auth
from tests.api.sse import events

LONG = {"inputs": "Count forever", "parameters": {"max_new_tokens": 2000}}


def blocks_used(service) -> int:  # type: ignore[no-untyped-def]
    """KV blocks held by sequences, from the worker's heartbeat (engine stats)."""
    keys = Keys(service.env["CONVEYOR_KEY_PREFIX"])
    with Redis.from_url(service.redis_url, decode_responses=True) as redis:
        [key] = list(redis.scan_iter(match=keys.workers_pattern))
        return WorkerInfo.model_validate_json(redis.get(key)).load.blocks_used


def until(predicate, timeout: float) -> float:  # type: ignore[no-untyped-def]
    """Seconds until predicate() held; fails past the timeout."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"not within {timeout}s"
        time.sleep(0.02)
    return time.monotonic() - started


def status(service, job_id: str) -> str:  # type: ignore[no-untyped-def]
    r = httpx.get(service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=10)
    return r.json()["status"]


def test_streaming_client_disconnect_frees_kv_within_a_second(tiny_service) -> None:  # type: ignore[no-untyped-def]
    with httpx.stream("POST", tiny_service.base_url + "/generate_stream", json=LONG, headers=auth("alice"),
                      timeout=60) as r:
        job_id = r.headers["x-job-id"]
        stream = events(r)  # (closing this iterator would close the connection: keep it)
        for _ in range(4):
            assert not next(stream)[1].get("details")
        until(lambda: blocks_used(tiny_service) > 0, timeout=5)
        assert status(tiny_service, job_id) == "running"
    # the connection is closed here, mid-generation
    until(lambda: status(tiny_service, job_id) == "cancelled", timeout=1.0)
    until(lambda: blocks_used(tiny_service) == 0, timeout=1.0)


def test_sync_client_disconnect_cancels_its_job(tiny_service) -> None:  # type: ignore[no-untyped-def]
    def alices_jobs() -> list[dict]:
        r = httpx.get(tiny_service.base_url + "/v1/jobs?limit=100", headers=auth("alice"), timeout=10)
        return r.json()["data"]

    before = {j["id"] for j in alices_jobs()}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(tiny_service.base_url + "/generate", json=LONG, headers=auth("alice"),
                   timeout=httpx.Timeout(10, read=2.0))
    until(lambda: {j["id"] for j in alices_jobs()} - before, timeout=5)
    [job_id] = {j["id"] for j in alices_jobs()} - before
    # "cancelled" cannot be reached by the job finishing; the bound is loose because this window also
    # holds the server noticing the disconnect, which on a loaded 2-core CI machine once took 1.06 s.
    # The one-second figure is the streaming test's.
    until(lambda: status(tiny_service, job_id) == "cancelled", timeout=3.0)
    until(lambda: blocks_used(tiny_service) == 0, timeout=3.0)


def test_openai_streaming_disconnect_cancels(tiny_service) -> None:  # type: ignore[no-untyped-def]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Go"}], "max_tokens": 2000,
            "stream": True}
    url = tiny_service.base_url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=auth("alice"), timeout=60) as r:
        job_id = r.headers["x-job-id"]
        next(events(r))
    until(lambda: status(tiny_service, job_id) == "cancelled", timeout=1.0)
