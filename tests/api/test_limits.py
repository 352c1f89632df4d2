"""The overall cap (max_concurrent_requests) and open access: an api alone with no keys and a cap
of 2 jobs queued or running; and the start-up refusal to run open on a non-loopback host."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import REPO, RunningService, start_service, stop_service

BODY = {"inputs": "Hello", "parameters": {"max_new_tokens": 5}}


@pytest.fixture(scope="module")
def tight_service(tmp_path_factory, services_redis, tiny_model_dir) -> Iterator[RunningService]:  # type: ignore[no-untyped-def]
    running = start_service(tmp_path_factory.mktemp("tight"), services_redis.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir), "CONVEYOR_MAX_CONCURRENT_REQUESTS": "2"}, workers=0)
    yield running
    stop_service(running)


def test_overall_cap_is_429_in_each_dialect_and_health_stays_200(tight_service) -> None:  # type: ignore[no-untyped-def]
    base = tight_service.base_url
    ids = [httpx.post(base + "/v1/jobs", json=BODY, timeout=30).json()["id"] for _ in range(2)]
    r = httpx.post(base + "/generate", json=BODY, timeout=30)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json() == {"error": "Model is overloaded", "error_type": "overloaded"}
    r = httpx.post(base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                   timeout=30)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"] == {"message": "Model is overloaded", "type": "overloaded", "param": None,
                                 "code": "overloaded"}
    assert httpx.get(base + "/health").status_code == 200
    jobs = httpx.get(base + "/v1/jobs").json()["data"]
    assert sorted(j["id"] for j in jobs) == sorted(ids)  # open access: one tenant, no key needed


def test_open_access_is_announced_at_start_up(tight_service) -> None:  # type: ignore[no-untyped-def]
    assert "no API keys configured: the api is open" in tight_service.logs()


def test_refuses_to_start_open_on_a_non_loopback_host(redis_server) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "REDIS_URL": redis_server.url}
    env = {k: v for k, v in env.items() if not k.startswith("CONVEYOR_API_KEYS")}
    # --port 0: should it start after all, it holds no port another process on the machine uses
    done = subprocess.run([sys.executable, "-m", "conveyor", "api", "--host", "0.0.0.0", "--port", "0"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "no API keys are configured" in done.stderr and "allow-unauthenticated" in done.stderr.replace(
        "allow_unauthenticated", "allow-unauthenticated")
