"""Admission across api replicas: three real api processes on one Redis and one key prefix (no
worker, so an admitted job stays outstanding) take a burst of 4× a cap of async submits at once,
spread over the three. The global `max_concurrent_requests` and the per-tenant cap hold exactly:
the admission scripts count and add in one step on Redis, so no replica can pass a cap another
replica is filling at the same moment; the rest are 429 with Retry-After, and nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from conveyor.jobqueue.keys import Keys
from conveyor.launcher.redis_server import EmbeddedRedis, free_port
from conveyor.wire.job import JobStatus, RecordField
from tests.api.conftest import KEYS, auth
from tests.conftest import RunningService, start_service, stop_service

CAP = 10  # max_concurrent_requests
TENANT_CAP = 8  # max_concurrent_requests_per_tenant
REPLICAS = 3
JOB = {"inputs": "Hello", "parameters": {"max_new_tokens": 5}}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
             tiny_model_dir: Path, keys_file: Path) -> Iterator[list[RunningService]]:
    prefix = f"fleet{free_port()}"
    env = {"CONVEYOR_MODEL": str(tiny_model_dir), "CONVEYOR_API_KEYS_FILE": str(keys_file),
           "CONVEYOR_KEY_PREFIX": prefix, "CONVEYOR_MAX_CONCURRENT_REQUESTS": str(CAP),
           "CONVEYOR_MAX_CONCURRENT_REQUESTS_PER_TENANT": str(TENANT_CAP)}
    running: list[RunningService] = []
    try:
        for i in range(REPLICAS):
            running.append(start_service(tmp_path_factory.mktemp(f"replica{i}"), services_redis.url, env,
                                         workers=0))
        yield running
    finally:
        for service in running:
            stop_service(service)


async def burst(replicas: list[RunningService], tenants: list[str]) -> list[httpx.Response]:
    """One async submit per entry of `tenants`, all at once, round-robin over the replicas."""
    limits = httpx.Limits(max_connections=len(tenants) + 10)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(*(
            client.post(replicas[i % len(replicas)].base_url + "/v1/jobs", json=JOB, headers=auth(tenant))
            for i, tenant in enumerate(tenants)))


def check_refusals(answers: list[httpx.Response]) -> list[httpx.Response]:
    """The accepted answers; every other one is a 429 with a Retry-After."""
    assert {r.status_code for r in answers} <= {202, 429}, [(r.status_code, r.text) for r in answers]
    refused = [r for r in answers if r.status_code == 429]
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    return [r for r in answers if r.status_code == 202]


async def end_all(redis: Redis, keys: Keys, accepted: list[httpx.Response]) -> None:
    """Marks the accepted jobs ended, as a worker would: the next admission prunes them."""
    for response in accepted:
        await redis.hset(keys.job(response.json()["id"]), RecordField.STATUS, JobStatus.SUCCEEDED.value)


async def queued(redis: Redis, keys: Keys) -> int:
    """Entries on every jobs stream (shards × bands)."""
    return sum([await redis.xlen(stream) for stream in keys.jobs_streams])


async def test_three_replicas_never_pass_the_global_or_the_tenant_cap(replicas: list[RunningService]) -> None:
    keys = Keys(replicas[0].env["CONVEYOR_KEY_PREFIX"])
    tenants = sorted(set(KEYS.values()))
    async with Redis.from_url(replicas[0].redis_url, decode_responses=True) as redis:
        # 4× the global cap, no tenant past its own cap: the global cap alone decides, exactly.
        spread = [tenants[i % len(tenants)] for i in range(4 * CAP)]
        assert max(spread.count(t) for t in tenants) <= TENANT_CAP
        accepted = check_refusals(await burst(replicas, spread))
        assert len(accepted) == CAP
        assert await queued(redis, keys) == CAP  # a refused submit wrote nothing
        assert await redis.zcard(keys.admitted) == CAP
        await end_all(redis, keys, accepted)

        # 4× the tenant cap from one tenant, with room under the global cap: the tenant cap decides.
        alice = check_refusals(await burst(replicas, ["alice"] * (4 * TENANT_CAP)))
        assert len(alice) == TENANT_CAP
        assert await redis.zcard(keys.tenant_active("alice")) == TENANT_CAP
        assert await queued(redis, keys) == CAP + TENANT_CAP
        # bob still gets what the global cap has left (the ended jobs are pruned on the way).
        bob = check_refusals(await burst(replicas, ["bob"] * (4 * TENANT_CAP)))
        assert len(bob) == CAP - TENANT_CAP
