"""Idempotency-Key expiry (docs/api/jobs.md, Idempotency): the key answers its job for `idempotency_ttl`
seconds (2 in `knobs_service`); once Redis has dropped the key, the same key and body make a new
job. The test waits on the key's expiry in Redis, not on a clock."""

from __future__ import annotations

import uuid

import httpx

from tests.api.conftest import auth, keys_of, redis_of, until

BODY = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}


def submit(service, key: str) -> httpx.Response:  # type: ignore[no-untyped-def]
    headers = {**auth("alice"), "Idempotency-Key": key}
    r = httpx.post(service.base_url + "/v1/jobs", json=BODY, headers=headers, timeout=30)
    assert r.status_code == 202, r.text
    return r


def test_a_key_answers_its_job_until_it_expires_then_makes_a_new_one(knobs_service) -> None:  # type: ignore[no-untyped-def]
    key = f"order-{uuid.uuid4().hex[:8]}"
    first = submit(knobs_service, key)
    assert "idempotent-replayed" not in first.headers
    again = submit(knobs_service, key)
    assert again.json()["id"] == first.json()["id"] and again.headers["idempotent-replayed"] == "true"

    idem = keys_of(knobs_service).idempotency("alice", key)
    with redis_of(knobs_service) as redis:
        ttl = redis.ttl(idem)
        assert 0 < ttl <= int(knobs_service.env["CONVEYOR_IDEMPOTENCY_TTL"])  # SET NX EX idempotency_ttl
        until(lambda: not redis.exists(idem), "Redis expired the Idempotency-Key", timeout=60)

    later = submit(knobs_service, key)
    assert later.json()["id"] != first.json()["id"] and "idempotent-replayed" not in later.headers
    for r in (first, later):
        httpx.delete(knobs_service.base_url + r.json()["urls"]["cancel"], headers=auth("alice"), timeout=30)
