"""One delivery attempt against a real Redis and a real receiver on loopback (no RQ here: the RQ
worker, retries through its scheduler and the engine worker are tests/worker/test_webhooks.py).

A socket audit hook records every connection this process attempts, so the SSRF tests show that a
refused target was never connected to — not merely that the attempt failed."""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterator

import pytest
from redis import Redis

from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.keys import Keys
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.settings import Settings
from conveyor.webhooks.delivery import Deliverer, retry_after
from conveyor.wire.job import RecordField, Webhook, WebhookDelivery
from tests.receiver import Receiver
from tests.worker.conftest import new_spec

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
CONNECTS: list[object] = []


def _audit(event: str, args: tuple) -> None:  # type: ignore[type-arg]
    if event == "socket.connect":
        CONNECTS.append(args[1])


sys.addaudithook(_audit)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


async def _job(redis, settings: Settings, url: str) -> str:  # type: ignore[no-untyped-def]
    spec = new_spec([1, 2, 3], tenant="alice", webhook=Webhook(url=url, events=["completed"]))
    await JobStore(redis, Keys(settings.key_prefix), settings).submit(spec)
    return spec.id


def _deliverer(redis_server: EmbeddedRedis, allow: str | None = None, schedule: str = "1,5") -> Deliverer:
    settings = Settings(redis_url=redis_server.url, key_prefix="dt", webhook_secrets=f"alice={SECRET}",
                        webhook_allow=allow, webhook_retry_schedule=schedule)
    return Deliverer(settings, Redis.from_url(redis_server.url, decode_responses=True))


def _delivery(redis_server: EmbeddedRedis, job_id: str) -> WebhookDelivery:
    with Redis.from_url(redis_server.url, decode_responses=True) as r:
        raw = r.hget(Keys("dt").job(job_id), RecordField.WEBHOOK_COMPLETED)
    return WebhookDelivery.model_validate_json(raw)


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/hook",
                                 "http://localhost:9/hook", "http://[::ffff:10.0.0.1]/hook"])
async def test_internal_targets_are_refused_before_any_connection(redis, redis_server, url) -> None:  # type: ignore[no-untyped-def]
    deliverer = _deliverer(redis_server)
    job_id = await _job(redis, Settings(key_prefix="dt"), url)
    CONNECTS.clear()
    outcome = deliverer.attempt(job_id, "completed", url, "alice", attempt=1)
    assert outcome.state == "refused" and outcome.retry_in is None
    assert [a for a in CONNECTS if not (isinstance(a, tuple) and a[1] == redis_server.port)] == []
    delivery = _delivery(redis_server, job_id)
    assert delivery.state == "refused" and len(delivery.attempts) == 1
    assert delivery.attempts[0].status_code is None and "webhook_allow" in (delivery.attempts[0].error or "")


async def test_allowed_name_is_pinned_to_the_checked_address(redis, redis_server, receiver) -> None:  # type: ignore[no-untyped-def]
    port = receiver.server.server_address[1]  # type: ignore[union-attr]
    url = f"http://localhost:{port}/hook"
    deliverer = _deliverer(redis_server, allow="127.0.0.1/32")
    job_id = await _job(redis, Settings(key_prefix="dt"), url)
    CONNECTS.clear()
    assert deliverer.attempt(job_id, "completed", url, "alice", attempt=1).state == "delivered"
    assert ("127.0.0.1", port) in CONNECTS
    [request] = receiver.got("/hook")
    assert request.headers["host"] == f"localhost:{port}"
    assert request.headers["webhook-id"] == f"msg_{job_id}_completed"


async def test_outcomes_by_answer(redis, redis_server, receiver) -> None:  # type: ignore[no-untyped-def]
    deliverer = _deliverer(redis_server, allow="127.0.0.1/32", schedule="1,5")
    url = receiver.url + "/hook"
    job_id = await _job(redis, Settings(key_prefix="dt"), url)
    receiver.script("/hook", (429, {"Retry-After": "2"}), 400, 410, 503)
    first = deliverer.attempt(job_id, "completed", url, "alice", attempt=1)
    assert first.state == "retrying" and first.retry_in == 2  # Retry-After, longer than the jittered 1 s
    assert deliverer.attempt(job_id, "completed", url, "alice", 2, first.body).state == "failed"  # 400
    assert deliverer.attempt(job_id, "completed", url, "alice", 2, first.body).state == "gone"  # 410
    assert deliverer.attempt(job_id, "completed", url, "alice", 3, first.body).state == "failed"  # 503, last
    delivery = _delivery(redis_server, job_id)
    assert [a.status_code for a in delivery.attempts] == [429, 400, 410, 503]
    assert len({r.body for r in receiver.got("/hook")}) == 1  # the same bytes each time


async def test_an_unknown_tenant_is_never_sent(redis, redis_server, receiver) -> None:  # type: ignore[no-untyped-def]
    deliverer = _deliverer(redis_server, allow="127.0.0.1/32")
    url = receiver.url + "/hook"
    job_id = await _job(redis, Settings(key_prefix="dt"), url)
    assert deliverer.attempt(job_id, "completed", url, "mallory", attempt=1).state == "refused"
    assert receiver.got("/hook") == []


def test_retry_after_in_seconds_or_as_a_date() -> None:
    now = 1_700_000_000.0
    assert retry_after("120", now) == 120
    assert retry_after("Tue, 14 Nov 2023 22:15:20 GMT", now) == 120  # 2023-11-14T22:13:20Z + 120 s
    assert retry_after("soon", now) is None and retry_after(None, now) is None
    assert retry_after("-5", now) == 0
