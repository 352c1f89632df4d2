"""The worker's APPEND script (conveyor/jobqueue/scripts/worker.py) counts an event as written only
when it is: a duplicate index is "already there", but a write Redis refuses (OOM at maxmemory) is
an error the worker retries — never an event silently dropped."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import redis
from redis import exceptions as rx

from conveyor.jobqueue.keys import event_entry_id
from conveyor.jobqueue.scripts.worker import APPEND
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.wire.job import RecordField as F

NOT_OWNER, WRITTEN, ALREADY_THERE = 0, 1, 2


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    server = EmbeddedRedis(Path(tempfile.mkdtemp())).start()
    yield redis.Redis.from_url(server.url, decode_responses=True)
    server.stop()


def test_only_a_duplicate_is_already_there_and_oom_is_an_error(server: redis.Redis) -> None:
    script = server.register_script(APPEND.source)
    server.hset("job", F.WORKER, "w1")

    def call(index: int, worker: str = "w1") -> int:
        event = f'[{{"index":{index}}}]'
        args = [worker, 1000, 1.0, 60, 60,
                event_entry_id(index), event, int(index == 0), 0, "", "", index]
        [[code], _] = script(keys=["job", "events"], args=args)
        return code

    assert call(0) == WRITTEN
    assert call(0) == ALREADY_THERE
    assert call(1, worker="w2") == NOT_OWNER
    server.config_set("maxmemory-policy", "noeviction")
    server.config_set("maxmemory", "1mb")
    with pytest.raises(rx.OutOfMemoryError):
        for i in range(100_000):
            server.set(f"fill-{i}", "x" * 100)
    with pytest.raises(rx.OutOfMemoryError):
        call(1)
    assert server.xlen("events") == 1  # nothing written, and the caller knows it
    server.config_set("maxmemory", "0")
    assert call(1) == WRITTEN  # the retry after Redis has room again
    assert [entry_id for entry_id, _ in server.xrange("events")] == [event_entry_id(0), event_entry_id(1)]


def test_one_call_writes_several_jobs_and_says_which_are_followed(server: redis.Redis) -> None:
    """One call per step: each job's ownership checked on its own, a lost job's batch not written,
    and whether an api follows each job (the record's `watched`), which the worker's live path needs
    (conveyor/worker/coalesce.py). The script publishes nothing: live messages are the publisher's."""
    script = server.register_script(APPEND.source)
    server.hset("a", F.WORKER, "w1")
    server.hset("b", mapping={F.WORKER: "w1", F.WATCHED: "1"})
    server.hset("c", F.WORKER, "w2")  # taken over by another worker

    def published() -> object:
        return server.info("commandstats").get("cmdstat_publish")

    before = published()

    def job() -> list[object]:
        return [event_entry_id(1), '[{"index":0},{"index":1}]', 1, 0, "", "", 1]

    codes, followed = script(keys=["a", "a-events", "b", "b-events", "c", "c-events"],
                             args=["w1", 1000, 1.0, 60, 60, *job(), *job(), *job()])
    assert codes == [WRITTEN, WRITTEN, NOT_OWNER]
    assert followed == ["", "1", ""]
    assert (server.xlen("a-events"), server.xlen("b-events"), server.exists("c-events")) == (1, 1, 0)
    assert server.hget("a", F.FIRST_TOKEN_AT) == "1.0"  # the first-token milestone
    assert published() == before
    with pytest.raises(rx.ResponseError, match="arguments per job"):
        script(keys=["a", "a-events"], args=["w1", 1000, 1.0, 60, 60])
