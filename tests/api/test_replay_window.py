"""`replay_window` (issue 39): an ended job's per-token events expire after the window, its record
lives `result_ttl` with the final event's index, and whatever reads a job after the window gets its
final result from the record: the relay (SSE replay, also with Last-Event-ID), `GET /v1/jobs/{id}`
unchanged, and the Batch runner collecting a line late. Against a real Redis, then real processes."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import httpx
import pytest

from conveyor.api.batch.runner import line_job_id
from conveyor.api.jobpath.relay import Relay
from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.settings import Settings
from conveyor.wire.job import JobResult, JobStatus, RecordField
from conveyor.worker.publisher import Publisher
from tests.api.conftest import auth, keys_of, redis_of, until
from tests.api.sse import events
from tests.api.test_batches import client, content_lines, long_lines, run_batch, wait_status
from tests.api.test_relay import KEYS, collect, owned, token_event
from tests.conftest import RunningService, start_service, stop_service


async def gone(redis, key: str, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    """Waits (bounded) for Redis to expire `key`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while await redis.exists(key):
        assert asyncio.get_running_loop().time() < deadline, f"{key} did not expire"
        await asyncio.sleep(0.05)


async def test_events_expire_after_the_window_and_replay_is_the_records_final_event(redis) -> None:  # type: ignore[no-untyped-def]
    publisher = Publisher(redis, KEYS, "w1", Scripts(redis), result_ttl=60, event_stream_maxlen=1000,
                          events_ttl=3)
    job = await owned(redis, "r1")
    await publisher.publish([(job, token_event(i, final=i == 4)) for i in range(5)])
    assert 0 < await redis.pttl(KEYS.events("r1")) <= 3000  # the window, not result_ttl
    assert 59_000 < await redis.pttl(KEYS.job("r1")) <= 60_000
    assert await redis.hget(KEYS.job("r1"), RecordField.FINAL) == "4"
    await gone(redis, KEYS.events("r1"))
    relay = Relay(redis, KEYS)
    await relay.start()
    try:
        for after in (-1, 0, 2, 3):  # from the start, or resumed anywhere before the end
            [final] = await asyncio.wait_for(collect(relay, "r1", after=after), 10)
            assert (final.index, final.final, final.token) == (4, True, None)
            assert final.result is not None and final.result.generated_text == "xxxxx"
        assert await asyncio.wait_for(collect(relay, "r1", after=4), 10) == []  # seen the end already
        await relay.check_resume("r1", 99)  # past the end of an ended job: no 422
    finally:
        await relay.stop()


async def test_a_job_ended_in_the_queue_keeps_its_final_event_too(redis) -> None:  # type: ignore[no-untyped-def]
    store = JobStore(redis, KEYS, Settings(replay_window=3, result_ttl=60))
    await redis.hset(KEYS.job("q1"), mapping={RecordField.STATUS: JobStatus.QUEUED.value})
    assert await store.end_queued("q1", JobStatus.CANCELLED)
    assert 0 < await redis.pttl(KEYS.events("q1")) <= 3000
    assert await redis.hget(KEYS.job("q1"), RecordField.FINAL) == "0"
    await gone(redis, KEYS.events("q1"))
    relay = Relay(redis, KEYS)
    await relay.start()
    try:
        [final] = await asyncio.wait_for(collect(relay, "q1"), 10)
        assert final.index == 0 and final.result is not None and final.result.status is JobStatus.CANCELLED
    finally:
        await relay.stop()


@pytest.fixture(scope="module")
def window_service(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
                   tiny_model_dir, keys_file) -> Iterator[RunningService]:  # type: ignore[no-untyped-def]
    running = start_service(tmp_path_factory.mktemp("window"), services_redis.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir),
        "CONVEYOR_API_KEYS_FILE": str(keys_file),
        "CONVEYOR_KV_CACHE_MEMORY": "16MiB",
        "CONVEYOR_REPLAY_WINDOW": "1",
        "CONVEYOR_BATCH_WINDOW": "4",
        "OMP_NUM_THREADS": "1",
    })
    yield running
    stop_service(running)


def sse_events(service: RunningService, job_id: str,
               last_event_id: int | None = None) -> list[tuple[int | None, dict]]:
    headers = auth("alice") | ({} if last_event_id is None else {"Last-Event-ID": str(last_event_id)})
    with httpx.stream("GET", service.base_url + f"/v1/jobs/{job_id}/events", headers=headers,
                      timeout=30) as response:
        assert response.status_code == 200
        return list(events(response))


def test_an_async_job_after_the_window(window_service: RunningService) -> None:
    s = window_service
    job_id = httpx.post(s.base_url + "/v1/jobs", headers=auth("alice"), timeout=30, json={
        "inputs": "Hello", "parameters": {"max_new_tokens": 8}}).json()["id"]
    live = sse_events(s, job_id)  # followed to its end
    final_index, final = live[-1]
    assert final["final"] and final_index == len(live) - 1
    view = httpx.get(s.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=30).json()
    with redis_of(s) as redis:
        until(lambda: not redis.exists(keys_of(s).events(job_id)), "the events expire after the window")
        assert redis.ttl(keys_of(s).job(job_id)) > 1000  # the record lives result_ttl
    assert httpx.get(s.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=30).json() == view
    text = "".join(data["token"]["text"] for _i, data in live if "token" in data)
    assert view["result"]["generated_text"] == text
    for after in (None, 0, final_index - 1):
        [(index, data)] = sse_events(s, job_id, after)
        assert index == final_index and data["final"] and "token" not in data
        assert data["result"] == final["result"] and data["result"]["generated_text"] == text
    assert sse_events(s, job_id, final_index) == []


def test_batch_lines_collected_after_the_window_are_completed(window_service: RunningService) -> None:
    """The api is frozen (SIGSTOP) while lines finish and their events expire; thawed, it collects
    them from their records: completed, with the text each job generated."""
    s = window_service
    c = client(s)
    lines = long_lines(6)
    batch = run_batch(c, lines)
    keys = keys_of(s)
    api = s.processes["api"]
    with redis_of(s) as redis:
        until(lambda: redis.exists(keys.job(line_job_id(batch.id, 0))), "the first line is submitted", 120)
        os.kill(api.pid, signal.SIGSTOP)
        try:
            late = [int(i) for i in redis.hkeys(keys.batch_window(batch.id))  # submitted, not collected
                    if redis.exists(keys.job(line_job_id(batch.id, int(i))))]
            assert late, "every line was collected before the api froze"
            for index in late:
                job = keys.job(line_job_id(batch.id, index))
                until(lambda job=job: JobStatus(redis.hget(job, RecordField.STATUS)).is_terminal,
                      "a line ends")
                until(lambda index=index: not redis.exists(keys.events(line_job_id(batch.id, index))),
                      "its events expire")
            results = {i: redis.hget(keys.job(line_job_id(batch.id, i)), RecordField.RESULT) for i in late}
            texts = {f"l{i}": JobResult.model_validate_json(r).generated_text for i, r in results.items()}
        finally:
            os.kill(api.pid, signal.SIGCONT)
    done = wait_status(c, batch.id, {"completed", "failed", "expired", "cancelled"})
    assert done.status == "completed" and done.request_counts.failed == 0, done
    out = {x["custom_id"]: x for x in content_lines(c, done.output_file_id)}
    assert len(out) == len(lines)
    for custom_id, text in texts.items():
        assert out[custom_id]["response"]["status_code"] == 200
        assert out[custom_id]["response"]["body"]["choices"][0]["text"] == text
