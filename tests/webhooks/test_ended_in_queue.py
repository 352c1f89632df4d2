"""The `completed` webhook of a job that ends while still queued (docs/operations/webhooks.md: "also when it
is cancelled or expires while still queued"): no worker ever sees such a job, so the api hands the
webhook to RQ itself. Real processes: the api with no engine worker, one `conveyor webhooks`
process, and a receiver on loopback; each delivery is verified as Standard Webhooks."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook as Verifier

from conveyor.launcher.redis_server import EmbeddedRedis
from tests.conftest import RunningService, start_service, stop_service
from tests.receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"the deployment's secret, 32 byte").decode()
BODY = {"inputs": "Hello", "parameters": {"max_new_tokens": 5}}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def hooked(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis, tiny_model_dir: Path,
           receiver: Receiver) -> Iterator[RunningService]:
    """The api (open, loopback) and one webhook process; no engine worker: jobs stay queued."""
    running = start_service(tmp_path_factory.mktemp("hooked"), services_redis.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir),
        "CONVEYOR_WEBHOOK_SECRET": SECRET,
        "CONVEYOR_WEBHOOK_ALLOW": "127.0.0.1/32",  # the receiver is on loopback
        "CONVEYOR_WEBHOOK_RETRY_SCHEDULE": "1,1",
    }, workers=0, webhook_workers=1)
    yield running
    stop_service(running)


def submit(service: RunningService, receiver: Receiver, path: str, **extra: object) -> str:
    webhook = {"url": receiver.url + path, "events": ["started", "completed"]}
    r = httpx.post(service.base_url + "/v1/jobs", json={**BODY, "webhook": webhook, **extra}, timeout=30)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def job(service: RunningService, job_id: str) -> dict:
    r = httpx.get(service.base_url + f"/v1/jobs/{job_id}", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


async def delivered(service: RunningService, receiver: Receiver, path: str, job_id: str) -> dict:
    """The one webhook the receiver got on `path`, verified, and recorded as delivered on the job;
    returns its envelope."""
    [request] = await receiver.wait_for(path, 1, timeout=120)
    envelope = Verifier(SECRET).verify(request.body, request.headers)
    assert request.headers["webhook-id"] == f"msg_{job_id}_completed"
    assert envelope["type"] == "job.completed" and envelope["data"]["id"] == job_id
    deliveries = await poll(lambda: [d for d in job(service, job_id)["webhook_deliveries"]
                                     if d["state"] == "delivered"], "the delivery was recorded")
    assert [(d["event"], d["url"]) for d in deliveries] == [("completed", receiver.url + path)]
    return envelope


async def poll(predicate, what: str, timeout: float = 60):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.05)
    return value


async def test_a_job_cancelled_in_the_queue_sends_its_completed_webhook(hooked, receiver) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(hooked, receiver, "/cancelled")
    r = httpx.delete(hooked.base_url + f"/v1/jobs/{job_id}", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
    envelope = await delivered(hooked, receiver, "/cancelled", job_id)
    assert envelope["data"]["status"] == "cancelled" and envelope["data"]["started_at"] is None
    assert envelope["data"]["result"]["finish_reason"] == "cancelled"


async def test_a_job_expired_in_the_queue_sends_its_completed_webhook(hooked, receiver) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(hooked, receiver, "/expired", ttl=0.5)
    assert job(hooked, job_id)["deadline"] is not None
    # The api expires a queued job past its deadline when it is looked at: poll until it has.
    final = await poll(lambda: (j := job(hooked, job_id))["status"] != "queued" and j,
                       "the job left the queue")
    assert final["status"] == "expired" and final["result"]["finish_reason"] == "expired"
    envelope = await delivered(hooked, receiver, "/expired", job_id)
    assert envelope["data"]["status"] == "expired" and envelope["data"]["started_at"] is None
