"""A submit either creates a job that will run or leaves nothing behind (conveyor/api/jobpath/store.py
`enqueue_after`): its record, its place in the tenant's listing and its queue entry are written all
together or not at all. The api runs alone (no worker) on a Redis of its own.

Two ways Redis refuses part of a submit: at its memory limit (a command is refused once memory is
past `maxmemory`: a submit written as separate commands got its record in and its entry refused —
a record queued forever, never run, listed to its tenant), and, deterministically, a user whose ACL
forbids XADD (the entry, the last command of a submit)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx
import pytest
from redis import Redis

from conveyor.jobqueue.keys import Keys
from conveyor.launcher.redis_server import EmbeddedRedis
from tests.conftest import RunningService, start_service, stop_service

pytestmark = pytest.mark.faults

PROMPT = "word " * 3000  # a spec of ~30 KB


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    server = EmbeddedRedis(Path(tempfile.mkdtemp())).start()
    yield server, Redis.from_url(server.url, decode_responses=True)
    server.stop()


def lone_api(redis_url: str, model: Path) -> RunningService:
    return start_service(Path(tempfile.mkdtemp()), redis_url, {"CONVEYOR_MODEL": str(model)}, workers=0)


def submit(service: RunningService) -> httpx.Response:
    return httpx.post(service.base_url + "/v1/jobs", json={"inputs": PROMPT}, timeout=60)


def check_whole(redis: Redis, service: RunningService, answers: list[httpx.Response]) -> None:
    """Every accepted job has its record, listing and entry; a refused one has none of them."""
    assert all(a.status_code in (202, 503) for a in answers), [a.text for a in answers]
    keys = Keys(service.env["CONVEYOR_KEY_PREFIX"])
    accepted = {a.json()["id"] for a in answers if a.status_code == 202}
    records = {key.rsplit(":", 1)[-1].strip("{}") for key in redis.scan_iter(match=keys.job("*"), count=1000)}
    queued = {fields["id"] for stream in keys.jobs_streams if redis.exists(stream)
              for _entry_id, fields in redis.xrange(stream)}
    listed = set(redis.zrange(keys.tenant_jobs("default"), 0, -1))
    assert records == accepted, "a record without its accepted job (half a job) or an accepted job lost"
    assert queued == accepted, "a queued entry for a refused job, or an accepted job not queued"
    assert listed == accepted, "the tenant's listing shows a job that does not exist"


def test_a_submit_whose_entry_is_refused_leaves_nothing(server, tiny_model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    embedded, redis = server
    redis.acl_setuser("api", enabled=True, passwords=["+api-pw"], keys=["*"], channels=["*"],
                      commands=["+@all", "-xadd"])
    service = lone_api(embedded.url.replace("redis://", "redis://api:api-pw@"), tiny_model_dir)
    try:
        answers = [submit(service) for _ in range(3)]
        assert [a.status_code for a in answers] == [503] * 3, [a.text for a in answers]
        check_whole(redis, service, answers)
    finally:
        stop_service(service)


def test_a_submit_refused_at_maxmemory_leaves_nothing(server, tiny_model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    embedded, redis = server
    service = lone_api(embedded.url, tiny_model_dir)
    try:
        redis.config_set("maxmemory-policy", "noeviction")
        redis.config_set("maxmemory", int(redis.info("memory")["used_memory"]) + 300_000)
        answers = []
        while len(answers) < 40 and (not answers or answers[-1].status_code != 503):
            answers.append(submit(service))
        redis.config_set("maxmemory", 0)
        assert answers[-1].status_code == 503 and "Retry-After" in answers[-1].headers, answers[-1].text
        assert any(a.status_code == 202 for a in answers)
        check_whole(redis, service, answers)
    finally:
        stop_service(service)
