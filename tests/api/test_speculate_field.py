"""`speculate: false` turns speculative decoding off for one request, in every dialect: the field
reaches the job's spec (read back from Redis) and the engine's parameters; the engine refusing a
draft to such a request is tests/engine/test_speculative.py's."""

from __future__ import annotations

import json

import httpx
import pytest

from conveyor.wire.job import JobSpec, RecordField
from conveyor.worker.translate import engine_request
from tests.api.conftest import auth, keys_of, redis_of

MSG = [{"role": "user", "content": "Repeat: a b c"}]
BODIES = {
    "tgi": lambda off: {"inputs": "a b c", "parameters": {"max_new_tokens": 2, **off}},
    "chat": lambda off: {"messages": MSG, "max_tokens": 2, **off},
    "completion": lambda off: {"prompt": "a b c", "max_tokens": 2, **off},
}


def spec_of(service, body: dict) -> JobSpec:  # type: ignore[no-untyped-def]
    r = httpx.post(service.base_url + "/v1/jobs", json=body, headers=auth("alice"), timeout=30)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    with redis_of(service) as redis:
        spec = JobSpec.model_validate(json.loads(redis.hget(keys_of(service).job(job_id), RecordField.SPEC)))
    httpx.delete(service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=30)
    return spec


@pytest.mark.parametrize("dialect", BODIES)
def test_speculate_false_reaches_the_engine(queue_service, dialect: str) -> None:  # type: ignore[no-untyped-def]
    off = spec_of(queue_service, BODIES[dialect]({"speculate": False}))
    default = spec_of(queue_service, BODIES[dialect]({}))
    assert off.sampling.speculate is False and default.sampling.speculate is True
    assert engine_request(off, None, [], queued=True).sampling.speculate is False
    assert engine_request(default, None, [], queued=True).sampling.speculate is True


def test_speculate_must_be_a_boolean(queue_service) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(queue_service.base_url + "/v1/chat/completions", headers=auth("alice"), timeout=30,
                   json=BODIES["chat"]({"speculate": "sometimes"}))
    assert r.status_code in (400, 422) and "speculate" in r.text
