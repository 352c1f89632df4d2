"""Services for the api tests: the real api and worker processes on a tiny random Llama (fast),
and an api with no worker at all (jobs stay queued: limits, idempotency, listing, cancel)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from launcher.redis_server import EmbeddedRedis
from tests.conftest import RunningService, start_service, stop_service
from tests.receiver import Receiver

KEYS = {"key-alice": "alice", "key-bob": "bob", "key-carol": "carol", "key-dave": "dave",
        "key-erin": "erin"}
ALICE_SECRET = "whsec_" + base64.b64encode(b"alice's webhook secret, 32 bytes").decode()


def auth(tenant: str) -> dict[str, str]:
    key = next(k for k, t in KEYS.items() if t == tenant)
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="session")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "api-keys.json"
    path.write_text(json.dumps(KEYS))
    return path


def wait_ready(service: RunningService, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(service.base_url + "/ready", timeout=5).status_code == 200:
            return
        time.sleep(0.2)
    raise RuntimeError("no worker became ready:\n" + service.logs())


@pytest.fixture(scope="session")
def otlp_collector() -> Iterator[Receiver]:
    """An OTLP/HTTP endpoint on loopback: it keeps every export the services send (POST /v1/traces)."""
    receiver = Receiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def tiny_service(tmp_path_factory: pytest.TempPathFactory, redis_server: EmbeddedRedis, tiny_model_dir: Path,
                 keys_file: Path, otlp_collector: Receiver) -> Iterator[RunningService]:
    """api + one worker on the tiny model, with API keys (tenants alice, bob, ...), tracing to
    `otlp_collector`, JSON logs."""
    running = start_service(tmp_path_factory.mktemp("tiny"), redis_server.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir),
        "CONVEYOR_API_KEYS_FILE": str(keys_file),
        "CONVEYOR_KV_CACHE_MEMORY": "16MiB",
        "CONVEYOR_HEARTBEAT_INTERVAL_MS": "200",
        "CONVEYOR_JOB_LEASE_MS": "2000",
        "CONVEYOR_OTLP_ENDPOINT": otlp_collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export spans 0.1 s after they end
        "CONVEYOR_LOG_FORMAT": "json",
        "OMP_NUM_THREADS": "1",
    })
    try:
        wait_ready(running)
        yield running
    finally:
        stop_service(running)


@pytest.fixture(scope="session")
def queue_service(tmp_path_factory: pytest.TempPathFactory, redis_server: EmbeddedRedis, tiny_model_dir: Path,
                  keys_file: Path) -> Iterator[RunningService]:
    """The api alone (no worker): every job stays queued until cancelled or expired."""
    running = start_service(tmp_path_factory.mktemp("queue"), redis_server.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir),
        "CONVEYOR_API_KEYS_FILE": str(keys_file),
        "CONVEYOR_MAX_CONCURRENT_REQUESTS_PER_TENANT": "3",
        "CONVEYOR_MAX_INPUT_TOKENS": "1000",
        "CONVEYOR_MAX_TOTAL_TOKENS": "2048",
        "CONVEYOR_PAYLOAD_LIMIT": "100000",
        "CONVEYOR_WEBHOOK_SECRETS": f"alice={ALICE_SECRET}",  # bob has none: his webhooks are refused
        "CONVEYOR_WEBHOOK_ALLOW": "backend.example",  # trusted by name: no DNS lookup in the tests
    }, workers=0)
    yield running
    stop_service(running)
