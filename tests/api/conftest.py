"""Services for the api tests: the real api and worker processes on a tiny random Llama (fast),
an api with no worker at all (jobs stay queued: limits, idempotency, listing, cancel), and one
with its knobs turned away from the defaults; helpers that wait on what they name."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.pubsub.publish import publish_to_followers
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.wire.heartbeat import WorkerInfo
from conveyor.wire.job import RecordField
from tests.conftest import RunningService, start_service, stop_service, sync_client
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


TERMINAL = {"succeeded", "failed", "cancelled", "expired"}


def until(predicate, what: str, timeout: float = 60):  # type: ignore[no-untyped-def]
    """predicate()'s first truthy value, polled; fails naming `what` past the (generous) timeout,
    which bounds a hang, not the speed of the machine."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.02)
    return value


def redis_of(service: RunningService) -> Redis:
    return sync_client(service.redis_url)


def keys_of(service: RunningService) -> Keys:
    return Keys(service.env["CONVEYOR_KEY_PREFIX"])


def publish_as_worker(redis: Redis, keys: Keys, job_id: str, batch: str) -> None:
    """A job's events (dump_events' JSON) published live as its worker does: to each api process that
    follows it (the record's `watched`), none if nobody does."""
    followers = (redis.hget(keys.job(job_id), RecordField.WATCHED) or "").split()
    pipe = redis.pipeline(transaction=False)
    publish_to_followers(pipe, keys, {follower: {job_id: batch} for follower in followers})
    pipe.execute()


def blocks_used(service: RunningService) -> int:
    """KV blocks held by sequences, from the (one) worker's heartbeat (engine stats)."""
    with redis_of(service) as redis:
        [key] = list(redis.scan_iter(match=keys_of(service).workers_pattern))
        return WorkerInfo.model_validate_json(redis.get(key)).load.blocks_used


@pytest.fixture(scope="session")
def otlp_collector() -> Iterator[Receiver]:
    """An OTLP/HTTP endpoint on loopback: it keeps every export the services send (POST /v1/traces)."""
    receiver = Receiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def tiny_service(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
                 tiny_model_dir: Path, keys_file: Path, otlp_collector: Receiver) -> Iterator[RunningService]:
    """api + one worker on the tiny model, with API keys (tenants alice, bob, ...), tracing to
    `otlp_collector`, JSON logs."""
    running = start_service(tmp_path_factory.mktemp("tiny"), services_redis.url, {
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
    yield running
    stop_service(running)


@pytest.fixture(scope="session")
def queue_service(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
                  tiny_model_dir: Path, keys_file: Path) -> Iterator[RunningService]:
    """The api alone (no worker): every job stays queued until cancelled or expired."""
    running = start_service(tmp_path_factory.mktemp("queue"), services_redis.url, {
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


# Away from every default, so a value read back can only have come from the settings.
KNOBS = {
    "CONVEYOR_GENERATE_PROMPT_FORMAT": "raw",
    "CONVEYOR_IDEMPOTENCY_TTL": "2",
    "CONVEYOR_SSE_KEEPALIVE_S": "0.3",
    "CONVEYOR_SERVED_MODEL_NAME": "tiny-knobs",
    "CONVEYOR_MAX_CONCURRENT_REQUESTS": "77",
    "CONVEYOR_MAX_STOP_SEQUENCES": "3",
    "CONVEYOR_MAX_BEST_OF": "3",
    "CONVEYOR_MAX_INPUT_TOKENS": "1000",
    "CONVEYOR_MAX_TOTAL_TOKENS": "2000",
    "CONVEYOR_MAX_TOP_N_TOKENS": "4",
    "CONVEYOR_MAX_BATCH_PREFILL_TOKENS": "1024",
    "CONVEYOR_MAX_BATCH_TOTAL_TOKENS": "30000",
    "CONVEYOR_MAX_BATCH_SIZE": "64",
    "CONVEYOR_MAX_WAITING_TOKENS": "7",
    "CONVEYOR_WAITING_SERVED_RATIO": "0.5",
}


@pytest.fixture(scope="session")
def knobs_service(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
                  tiny_model_dir: Path, keys_file: Path) -> Iterator[RunningService]:
    """The api alone (no worker: jobs stay queued) with KNOBS: raw prompts, a 2 s Idempotency-Key
    TTL, SSE keep-alives every 0.3 s, limits away from their defaults."""
    running = start_service(tmp_path_factory.mktemp("knobs"), services_redis.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir), "CONVEYOR_API_KEYS_FILE": str(keys_file), **KNOBS}, workers=0)
    yield running
    stop_service(running)
