"""The api alone, no worker (jobs stay queued): idempotency, listing, cancel and expiry of queued jobs,
webhooks, the per-tenant cap, readiness. Settings: per-tenant cap 3, max_input_tokens 1000."""

from __future__ import annotations

import re
import time

import httpx
from redis import Redis

from conveyor.jobqueue.keys import Keys
from tests.api.conftest import auth
from tests.api.sse import events

BODY = {"inputs": "Hello", "parameters": {"max_new_tokens": 5}}


def post(service, body: dict, tenant: str, **headers: str) -> httpx.Response:  # type: ignore[no-untyped-def]
    headers = {**auth(tenant), **headers}
    return httpx.post(service.base_url + "/v1/jobs", json=body, headers=headers, timeout=30)


def cancel(service, job_id: str, tenant: str) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.delete(service.base_url + f"/v1/jobs/{job_id}", headers=auth(tenant), timeout=30)


def test_idempotency_key_answers_the_same_job(queue_service) -> None:  # type: ignore[no-untyped-def]
    first = post(queue_service, BODY, "alice", **{"Idempotency-Key": "order-17"})
    again = post(queue_service, BODY, "alice", **{"Idempotency-Key": "order-17"})
    assert first.status_code == again.status_code == 202, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    other_tenant = post(queue_service, BODY, "bob", **{"Idempotency-Key": "order-17"})
    assert other_tenant.json()["id"] != first.json()["id"]
    changed = post(queue_service, {**BODY, "inputs": "Other"}, "alice", **{"Idempotency-Key": "order-17"})
    assert changed.status_code == 422 and changed.json()["error"]["param"] == "Idempotency-Key"
    for job in (first, other_tenant):
        cancel(queue_service, job.json()["id"], "alice" if job is first else "bob")


def test_cancel_a_queued_job_ends_it_at_once(queue_service) -> None:  # type: ignore[no-untyped-def]
    job_id = post(queue_service, BODY, "alice").json()["id"]
    r = cancel(queue_service, job_id, "alice")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    with httpx.stream("GET", queue_service.base_url + f"/v1/jobs/{job_id}/events", headers=auth("alice"),
                      timeout=30) as stream:
        [(index, final)] = list(events(stream))
    assert index == 0 and final["final"] and final["result"]["status"] == "cancelled"


def test_queued_job_past_its_ttl_is_expired(queue_service) -> None:  # type: ignore[no-untyped-def]
    job_id = post(queue_service, {**BODY, "ttl": 0.2}, "alice").json()["id"]
    deadline = time.monotonic() + 5
    while (job := httpx.get(queue_service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice")).json())[
            "status"] == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert job["status"] == "expired" and job["deadline"] <= job["finished_at"]


def test_webhook_priority_and_deadline_are_stored(queue_service) -> None:  # type: ignore[no-untyped-def]
    hook = {"url": "https://backend.example/hooks/conveyor", "events": ["started", "completed"]}
    body = {**BODY, "webhook": hook, "priority": 7, "deadline": "2999-01-01T00:00:00Z"}
    job_id = post(queue_service, body, "alice").json()["id"]
    job = httpx.get(queue_service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice")).json()
    assert job["webhook"] == hook and job["priority"] == 7 and job["deadline"] == 32472144000.0
    keys = Keys(queue_service.env["CONVEYOR_KEY_PREFIX"])
    with Redis.from_url(queue_service.redis_url, decode_responses=True) as redis:
        spec = redis.hget(keys.job(job_id), "spec")
    assert '"webhook":{"url":"https://backend.example/hooks/conveyor"' in spec
    cancel(queue_service, job_id, "alice")


def test_list_is_paginated_newest_first_and_per_tenant(queue_service) -> None:  # type: ignore[no-untyped-def]
    ids = [post(queue_service, BODY, "carol").json()["id"] for _ in range(3)]
    for job_id in ids:
        cancel(queue_service, job_id, "carol")
    ids += [post(queue_service, BODY, "carol").json()["id"] for _ in range(2)]
    seen, after = [], None
    while True:
        params = {"limit": 2, **({"after": after} if after else {})}
        page = httpx.get(queue_service.base_url + "/v1/jobs", params=params, headers=auth("carol")).json()
        seen += [j["id"] for j in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == ids[::-1]
    assert all(j["id"] not in ids for j in httpx.get(queue_service.base_url + "/v1/jobs",
                                                    headers=auth("dave")).json()["data"])
    for job_id in ids[3:]:
        cancel(queue_service, job_id, "carol")


def test_per_tenant_cap_is_429_with_retry_after(queue_service) -> None:  # type: ignore[no-untyped-def]
    ids = [post(queue_service, BODY, "dave").json()["id"] for _ in range(3)]
    over = httpx.post(queue_service.base_url + "/generate", json=BODY, headers=auth("dave"), timeout=30)
    assert over.status_code == 429
    assert over.json() == {"error": "Model is overloaded", "error_type": "overloaded"}
    assert int(over.headers["retry-after"]) >= 1
    over = post(queue_service, BODY, "dave")
    assert over.status_code == 429 and over.json()["error"]["code"] == "overloaded"
    assert post(queue_service, BODY, "erin").status_code == 202  # another tenant is not held back
    assert httpx.get(queue_service.base_url + "/health").status_code == 200
    cancel(queue_service, ids[0], "dave")
    accepted = post(queue_service, BODY, "dave")  # a cancelled job no longer counts
    assert accepted.status_code == 202
    for job_id in [*ids[1:], accepted.json()["id"]]:
        cancel(queue_service, job_id, "dave")


def test_ready_counts_workers_but_does_not_need_one(queue_service) -> None:  # type: ignore[no-untyped-def]
    """With no worker the api stays ready (jobs wait in the queue; an autoscaler can start workers
    from zero), and says so; a worker's beat in the heartbeat index is counted, without a SCAN."""
    r = httpx.get(queue_service.base_url + "/ready")
    assert r.status_code == 200, r.text
    assert r.json()["workers"] == 0 and r.json()["reason"].startswith("no worker heartbeat"), r.text
    keys = Keys(queue_service.env["CONVEYOR_KEY_PREFIX"])
    with Redis.from_url(queue_service.redis_url, decode_responses=True) as redis:
        redis.zadd(keys.worker_beats, {"w-test": time.time()})
        try:
            r = httpx.get(queue_service.base_url + "/ready")
            assert r.status_code == 200 and r.json() == {"status": "ready", "redis": True, "relay": True,
                                                         "workers": 1, "reason": None}
        finally:
            redis.zrem(keys.worker_beats, "w-test")
        redis.zadd(keys.worker_beats, {"w-gone": time.time() - 3600})  # its beat is older than a lease
        try:
            assert httpx.get(queue_service.base_url + "/ready").json()["workers"] == 0
        finally:
            redis.zrem(keys.worker_beats, "w-gone")


def test_metrics_show_the_queue_per_band_and_summed(queue_service) -> None:  # type: ignore[no-untyped-def]
    def samples() -> dict[str, float]:
        text = httpx.get(queue_service.base_url + "/metrics", timeout=10).text
        # One model here: its label is dropped, so the series read as before there were models.
        return {re.sub(r'model="[^"]*",?', "", line.rsplit(" ", 1)[0]): float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def queued(band: str) -> float:
        return samples()[f'conveyor_queue_jobs{{band="{band}",shard="0",status="queued"}}']

    before = samples()
    bands = {10: "high", 0: "normal", -100: "batch"}
    jobs = [post(queue_service, {**BODY, "priority": p}, "bob") for p in bands]
    assert [j.status_code for j in jobs] == [202] * 3, [j.text for j in jobs]
    after = samples()
    for band in bands.values():  # no worker: each job waits on its band's stream
        assert queued(band) == before[f'conveyor_queue_jobs{{band="{band}",shard="0",status="queued"}}'] + 1
    assert after['conveyor_jobs{status="queued"}'] == before['conveyor_jobs{status="queued"}'] + 3
    assert after['conveyor_jobs{status="queued"}'] == sum(
        v for k, v in after.items() if k.startswith("conveyor_queue_jobs") and 'status="queued"' in k)
    for job in jobs:
        cancel(queue_service, job.json()["id"], "bob")
