"""The console's tests: a real api + worker on the tiny model with API keys (alice is an operator,
bob is not), headless Chromium driven by selenium, and a way to put a job in the dead-letter stream
exactly as a worker does (conveyor/worker/publisher.py `dead_letter`).

The browser is Debian's `chromium` + `chromium-driver` (`.ci/run` installs them under CI). Without
them the browser tests are skipped with the reason — except under CI=true, where they fail."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis as AsyncRedis

from conveyor.jobqueue.keys import event_entry_id
from conveyor.jobqueue.queue import Entry
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.wire.job import JobEvent, JobResult, JobSpec, JobStatus, RecordField, StoppingSpec
from conveyor.worker.publisher import Publisher
from tests.api.conftest import KEYS, keys_of, redis_of, until
from tests.conftest import REPO, RunningService, start_service, stop_service

# The docs' screenshots (docs/console/) are retaken with CONVEYOR_UPDATE_SCREENSHOTS=1; otherwise a
# test run leaves the tree alone and writes them to a temporary directory.
SHOTS = (REPO / "docs" / "console" if os.environ.get("CONVEYOR_UPDATE_SCREENSHOTS") == "1"
         else Path(tempfile.gettempdir()) / "conveyor-console-shots")
MAX_TOTAL_TOKENS = 8000


def key_of(tenant: str) -> str:
    return next(k for k, t in KEYS.items() if t == tenant)


@pytest.fixture(scope="session")
def console_service(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
                    tiny_model_dir: Path) -> Iterator[RunningService]:
    """api + one worker on the tiny model; alice is in admin_tenants, bob is not."""
    tmp = tmp_path_factory.mktemp("console")
    keys_file = tmp / "api-keys.json"
    keys_file.write_text(json.dumps(KEYS))
    running = start_service(tmp, services_redis.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir),
        "CONVEYOR_API_KEYS_FILE": str(keys_file),
        "CONVEYOR_ADMIN_TENANTS": "alice",
        "CONVEYOR_KV_CACHE_MEMORY": "16MiB",
        "CONVEYOR_MAX_TOTAL_TOKENS": str(MAX_TOTAL_TOKENS),
        "CONVEYOR_HEARTBEAT_INTERVAL_MS": "200",
        "CONVEYOR_JOB_LEASE_MS": "2000",
        "OMP_NUM_THREADS": "1",
    })
    yield running
    stop_service(running)


def dead_letter(service: RunningService, tenant: str = "alice", reason: str = "delivered 4 times "
                "(max_attempts=3): each worker that ran it stopped before finishing it") -> tuple[str, str]:
    """A job that failed and went to the dead-letter stream, left as a worker leaves it: its record
    `failed` with a result, its event stream ending with that final event, and the entry written by
    the worker's own `dead_letter`. Returns (dead-letter entry id, job id)."""
    keys = keys_of(service)
    spec = JobSpec(id=uuid.uuid4().hex, tenant=tenant, created_at=time.time(), prompt_ids=[504, 3458, 314],
                   stopping=StoppingSpec(max_new_tokens=6, ignore_eos=True))
    payload = spec.model_dump_json(exclude_none=True)
    result = JobResult.final(JobStatus.FAILED, error=reason)
    with redis_of(service) as redis:
        redis.hset(keys.job(spec.id), mapping={
            RecordField.STATUS: "failed", RecordField.SPEC: payload, RecordField.TENANT: tenant,
            RecordField.ATTEMPTS: 4, RecordField.WORKER: "gone",
            RecordField.RESULT: result.model_dump_json(exclude_none=True),
            RecordField.FINISHED_AT: time.time()})
        redis.xadd(keys.events(spec.id), {"e": JobEvent.ending(0, result).model_dump_json(exclude_none=True)},
                   id=event_entry_id(0))
        redis.zadd(keys.tenant_jobs(tenant), {spec.id: spec.created_at})

    async def write() -> None:
        client = AsyncRedis.from_url(service.redis_url, decode_responses=True)
        try:
            publisher = Publisher(client, keys, "worker-gone", None, 3600, 16384)  # type: ignore[arg-type]
            stream = keys.stream_of(spec.id, spec.priority)
            await publisher.dead_letter(Entry(stream, "1-0", {"id": spec.id, "spec": payload}, 4), reason)
        finally:
            await client.aclose()

    asyncio.run(write())
    with redis_of(service) as redis:
        [(entry_id, _)] = [e for e in redis.xrange(keys.dead_letter_stream) if e[1]["id"] == spec.id]
    return entry_id, spec.id


def job_view(service: RunningService, job_id: str, tenant: str = "alice") -> dict[str, Any]:
    answer = httpx.get(f"{service.base_url}/v1/jobs/{job_id}",
                       headers={"Authorization": f"Bearer {key_of(tenant)}"}, timeout=10)
    answer.raise_for_status()
    return answer.json()


def wait_ended(service: RunningService, job_id: str, tenant: str = "alice") -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        view = job_view(service, job_id, tenant)
        return view if view["status"] not in ("queued", "running") else None

    return until(ended, f"job {job_id} ended")


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", chromium), ("chromium-driver", driver)) if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    if missing:
        reason = (f"BROWSER TESTS NOT RUN: {', '.join(missing)} missing; install Debian's browser with "
                  "`make browser` (apt-get install -y chromium chromium-driver; .ci/run does under CI=true)")
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return chromium or "", driver or ""


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Chromium (selenium + chromedriver), with no network of its own beyond loopback."""
    chromium, driver_path = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
