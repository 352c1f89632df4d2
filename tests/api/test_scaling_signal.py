"""The autoscaling signal (issue 39): what KEDA computes from the api's `GET /queue`, with the trigger
of deploy/k8s/base/worker-scaler.yaml, equals the workers the jobs in the queue want, at every step of
a backlog filling (through the api, over two shards and every band) and draining (a worker's reads and
acknowledgements), then with a real worker process started from zero."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from conveyor.jobqueue.keys import WORKER_GROUP, Keys
from conveyor.launcher.redis_server import EmbeddedRedis
from tests.api.conftest import TERMINAL, keys_of, redis_of, until
from tests.conftest import REPO, RunningService, start_service, stop_service

BATCH = 3  # max_batch_size: a worker per 3 jobs waiting or running
PRIORITIES = (10, 0, -5, -10)  # one per band: high, normal, low, batch
SCALER = REPO / "deploy" / "k8s" / "base" / "worker-scaler.yaml"


def keda_replicas(body: dict) -> int:
    """What KEDA's metrics-api trigger makes of the answer: the value at `valueLocation` (a top-level
    field, GJSON's plain path); active above `activationTargetValue`, then the HPA's replica count for
    an AverageValue target, ceil(value / targetValue); inactive: 0 (scale-to-zero's minimum)."""
    [trigger] = yaml.safe_load(SCALER.read_text())["spec"]["triggers"]
    meta = trigger["metadata"]
    value = float(body[meta["valueLocation"]])
    if value <= float(meta["activationTargetValue"]):
        return 0
    return math.ceil(value / float(meta["targetValue"]))


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
           tiny_model_dir: Path) -> Iterator[RunningService]:
    """The api alone at first (the test starts the worker), 2 shards, batches of BATCH."""
    running = start_service(tmp_path_factory.mktemp("scaled"), services_redis.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir),
        "CONVEYOR_JOBS_SHARDS": "2",
        "CONVEYOR_MAX_BATCH_SIZE": str(BATCH),
        "CONVEYOR_KV_CACHE_MEMORY": "16MiB",
        "OMP_NUM_THREADS": "1",
    }, workers=0)
    yield running
    stop_service(running)


def queue(service: RunningService) -> dict:
    answer = httpx.get(service.base_url + "/queue", timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def submit(service: RunningService, priority: int) -> str:
    answer = httpx.post(service.base_url + "/v1/jobs", json={
        "inputs": "Hello", "priority": priority, "parameters": {"max_new_tokens": 4}}, timeout=30)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def check(service: RunningService, waiting: int, running: int) -> None:
    body = queue(service)
    jobs = waiting + running
    assert (body["waiting"], body["running"], body["jobs"]) == (waiting, running, jobs), body
    assert keda_replicas(body) == math.ceil(jobs / BATCH), body


def test_keda_asks_for_the_workers_the_queue_wants_at_every_step(scaled: RunningService) -> None:
    keys = keys_of(scaled)
    assert keys.jobs_shards == 1  # keys_of reads the prefix only: the layout is the service's
    keys = Keys(keys.prefix, jobs_shards=2)
    check(scaled, 0, 0)
    n, shards = 0, set()
    while n < 7 or shards != {0, 1}:  # filling: every band, both shards (the random ids decide)
        n += 1
        shards.add(keys.shard_of(submit(scaled, PRIORITIES[n % len(PRIORITIES)])))
        check(scaled, n, 0)
        assert n < 64, f"{n} job ids, all in shard {shards}: Keys.shard_of no longer spreads them"
    with redis_of(scaled) as redis:
        assert {keys.shard_of(fields["id"]) for stream in keys.jobs_streams
                for _id, fields in redis.xrange(stream)} == {0, 1}
        waiting, running = n, 0
        for stream in keys.jobs_streams:  # draining as a worker does: read, then XACK and XDEL
            for entry_id, _fields in redis.xrange(stream):
                [[_s, [(read_id, _)]]] = redis.xreadgroup(WORKER_GROUP, "drainer", {stream: ">"}, count=1)
                assert read_id == entry_id
                waiting, running = waiting - 1, running + 1
                check(scaled, waiting, running)
                redis.xack(stream, WORKER_GROUP, entry_id)
                redis.xdel(stream, entry_id)
                running -= 1
                check(scaled, waiting, running)
    assert (waiting, running) == (0, 0)


def test_a_worker_started_from_zero_drains_the_queue_to_zero_wanted(scaled: RunningService) -> None:
    jobs = [submit(scaled, priority) for priority in PRIORITIES]
    body = queue(scaled)
    assert body["waiting"] == len(jobs) and keda_replicas(body) == 2  # 4 jobs, 3 per worker
    scaled.metrics_ports["worker0"] = 0
    scaled.spawn("worker0")  # what KEDA's scale from zero does
    scaled.wait_ready(1)  # its model loaded (bounded by the readiness timeout, not the job's)
    for job_id in jobs:
        until(lambda job_id=job_id: httpx.get(scaled.base_url + f"/v1/jobs/{job_id}", timeout=30).json()[
            "status"] in TERMINAL, f"job {job_id} ends")
        assert httpx.get(scaled.base_url + f"/v1/jobs/{job_id}", timeout=30).json()["status"] == "succeeded"
    body = until(lambda: (b := queue(scaled))["jobs"] == 0 and b, "the queue empties")
    assert (body["workers_wanted"], keda_replicas(body)) == (0, 0)
