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
from conveyor.jobqueue.scripts.worker import append
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.wire.job import RecordField as F

NOT_OWNER, WRITTEN, ALREADY_THERE = 0, 1, 2


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    server = EmbeddedRedis(Path(tempfile.mkdtemp())).start()
    yield redis.Redis.from_url(server.url, decode_responses=True)
    server.stop()


def test_only_a_duplicate_is_already_there_and_oom_is_an_error(server: redis.Redis) -> None:
    script = server.register_script(append("PUBLISH").source)
    server.hset("job", F.WORKER, "w1")

    def call(index: int, worker: str = "w1") -> int:
        event = f'{{"index":{index}}}'
        args = [worker, event_entry_id(index), event, 1000, "channel", 1.0, int(index == 0), 0, "", "", 60]
        return script(keys=["job", "events"], args=args)

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
