"""`submit_replicas` (issue 39): a submit is answered once a replica has the job (Redis WAIT on the
connection that wrote it). A real primary and replica on loopback: with the replica running the job
is on it when the 202 arrives; with the replica paused the submit answers 503 naming the setting, the
job stays queued on the primary, and a retry with the same Idempotency-Key answers that job."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio.cluster import RedisCluster

from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.keys import Keys
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.settings import Settings
from tests.api.conftest import keys_of, until
from tests.conftest import RunningService, start_service, stop_service, sync_client

BODY = {"inputs": "Hello", "parameters": {"max_new_tokens": 4}}


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory,
               tiny_model_dir: Path) -> Iterator[tuple[RunningService, EmbeddedRedis, EmbeddedRedis]]:
    """The api alone on a primary with one replica, submit_replicas=1."""
    primary = EmbeddedRedis(tmp_path_factory.mktemp("primary")).start()
    replica = EmbeddedRedis(tmp_path_factory.mktemp("replica"),
                            extra_args=("--replicaof", "127.0.0.1", str(primary.port))).start()
    with sync_client(replica.url) as r:
        until(lambda: r.info("replication")["master_link_status"] == "up", "the replica follows the primary")
    service = start_service(tmp_path_factory.mktemp("api"), primary.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir),
        "CONVEYOR_SUBMIT_REPLICAS": "1",
        "CONVEYOR_SUBMIT_REPLICAS_TIMEOUT_MS": "300",
    }, workers=0)
    yield service, primary, replica
    stop_service(service)
    replica.stop()
    primary.stop()


def submit(service: RunningService, key: str) -> httpx.Response:
    return httpx.post(service.base_url + "/v1/jobs", json=BODY, headers={"Idempotency-Key": key}, timeout=30)


def test_a_submit_is_answered_once_the_replica_has_the_job(replicated) -> None:  # type: ignore[no-untyped-def]
    service, _primary, replica = replicated
    answer = submit(service, "with-replica")
    assert answer.status_code == 202, answer.text
    with sync_client(replica.url) as r:  # read at once: WAIT returned after the replica applied it
        assert r.hget(keys_of(service).job(answer.json()["id"]), "status") == "queued"


def test_a_replica_that_does_not_confirm_gives_503_and_keeps_the_job(replicated) -> None:  # type: ignore[no-untyped-def]
    service, primary, replica = replicated
    assert replica.process is not None
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        refused = submit(service, "paused-replica")
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0, refused.text
    message = refused.json()["error"]["message"]
    assert "0 of 1 replica(s) confirmed" in message and "submit_replicas" in message, message
    job_id = message.split()[1]
    with sync_client(primary.url) as r:
        assert r.hget(keys_of(service).job(job_id), "status") == "queued"
    again = submit(service, "paused-replica")  # the key still names the job: no second one
    assert again.status_code == 202 and again.json()["id"] == job_id, again.text
    assert again.headers["idempotent-replayed"] == "true"


def test_submit_replicas_is_refused_on_a_cluster() -> None:
    cluster = RedisCluster(host="127.0.0.1", port=1)  # not connected: the check reads the client's kind
    with pytest.raises(ValueError, match="submit_replicas needs one primary"):
        JobStore(cluster, Keys(), Settings(redis_url="redis://127.0.0.1:1", submit_replicas=1))
