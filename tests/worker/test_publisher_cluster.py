"""On a Redis Cluster the publisher writes a step's events with one APPEND call per node, not one per
job (each job's keys have a slot of their own): APPEND_NODE, flagged allow-cross-slot-keys, takes a
node's jobs of every slot. Where the client's map of slots is stale (a failover, a resharding) the
call reaches a key its node does not serve, and the publisher writes those jobs again one slot a
call: every event once, every job's followers still read. On a real 3-node cluster."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from conveyor.jobqueue.client import make_client
from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.launcher.redis_cluster import LocalCluster
from conveyor.settings import Settings
from conveyor.wire.job import EventToken, JobEvent
from conveyor.wire.job import RecordField as F
from conveyor.worker.owned import InFlight
from conveyor.worker.publisher import Publisher

JOBS = 24


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(Path(tmp_path_factory.mktemp("cluster")), nodes=3) as running:
        yield running


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[Any]:
    async with make_client(Settings(redis_url=cluster.url, redis_cluster=True), decode_responses=True) as c:
        yield c


def evalsha_calls(cluster: LocalCluster) -> int:
    total = 0
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as one:
            total += int(one.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    return total


async def jobs_owned_by(client: Any, keys: Keys, worker: str) -> list[InFlight]:
    """Records owned by `worker`; every third followed by the api process `api-N`."""
    jobs = [InFlight(job_id=uuid.uuid4().hex, entry_id="", created_at=0.0) for _ in range(JOBS)]
    for n, job in enumerate(jobs):
        fields = {F.WORKER: worker, **({F.WATCHED: f"api-{n}"} if n % 3 == 0 else {})}
        await client.hset(keys.job(job.job_id), mapping=fields)
    return jobs


def tokens(jobs: list[InFlight], index: int) -> list[tuple[InFlight, JobEvent]]:
    return [(job, JobEvent(index=index, token=EventToken(id=7, text="a"), at=1.0)) for job in jobs]


async def check_written(client: Any, keys: Keys, jobs: list[InFlight], count: int) -> None:
    for n, job in enumerate(jobs):
        assert await client.xlen(keys.events(job.job_id)) == count, job.job_id
        assert job.followers == ({f"api-{n}"} if n % 3 == 0 else set())


async def test_one_call_per_node_writes_every_job_of_a_step(cluster: LocalCluster, client: Any) -> None:
    keys = Keys(f"t{uuid.uuid4().hex[:6]}")
    publisher = Publisher(client, keys, "w1", Scripts(client), result_ttl=60, event_stream_maxlen=1000)
    jobs = await jobs_owned_by(client, keys, "w1")
    nodes = {client.get_node_from_key(keys.job(job.job_id)).name for job in jobs}
    await publisher.publish(tokens(jobs, 0))  # the first call loads the scripts
    before = evalsha_calls(cluster)
    published = await publisher.publish(tokens(jobs, 1))
    assert evalsha_calls(cluster) - before == len(nodes)  # not one per job
    assert published.lost == []
    await check_written(client, keys, jobs, 2)


async def test_a_stale_map_of_slots_falls_back_to_one_call_per_slot(
    cluster: LocalCluster, client: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="conveyor.worker.publisher")
    keys = Keys(f"t{uuid.uuid4().hex[:6]}")
    publisher = Publisher(client, keys, "w1", Scripts(client), result_ttl=60, event_stream_maxlen=1000)
    jobs = await jobs_owned_by(client, keys, "w1")
    one = client.get_node_from_key(keys.job(jobs[0].job_id))
    assert {client.get_node_from_key(keys.job(job.job_id)).name for job in jobs} != {one.name}
    monkeypatch.setattr(client, "get_node_from_key", lambda key, replica=False: one)  # every slot "there"
    published = await publisher.publish(tokens(jobs, 0))
    assert "no longer serves" in caplog.text  # the node's call failed, and the slots' calls wrote
    assert published.lost == []
    await check_written(client, keys, jobs, 1)  # once each: what the failed call wrote is not doubled
    other = await jobs_owned_by(client, keys, "w2")  # and a job owned by another worker stays unwritten
    published = await publisher.publish(tokens(other, 0))
    assert {job.job_id for job in published.lost} == {job.job_id for job in other}
