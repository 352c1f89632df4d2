"""`/info`'s `model_dtype` and `model_device_type` say what the workers run (from their heartbeats),
and with no worker known what the settings decide: never `float32` for a fleet on CUDA."""

from __future__ import annotations

import time

import httpx
import pytest

from conveyor.api.app import model_runtime
from conveyor.jobqueue.keys import Keys
from conveyor.settings import Settings
from conveyor.wire.heartbeat import WorkerInfo
from tests.conftest import RunningService


def worker(worker_id: str, device: str, dtype: str) -> WorkerInfo:
    now = time.time()
    return WorkerInfo(id=worker_id, pid=1, host="h", model="m", device=device, dtype=dtype, kv_blocks=8,
                      block_size=16, max_batch_size=4, started_at=now, heartbeat_at=now)


@pytest.mark.parametrize(("device", "workers", "expected"), [
    ("auto", [worker("a", "cuda:0", "bfloat16")], ("bfloat16", "cuda")),
    ("auto", [worker("a", "cpu", "float32")], ("float32", "cpu")),
    ("auto", [worker("a", "cuda:0", "bfloat16"), worker("b", "cpu", "float32")],
     ("bfloat16,float32", "cpu,cuda")),  # a mixed fleet says so
    ("auto", [], ("auto", "auto")),  # each worker decides: the api does not pretend to know
    ("cpu", [], ("float32", "cpu")),
    ("cuda", [], ("bfloat16", "cuda")),
    ("cpu", [worker("a", "cpu", "bfloat16")], ("bfloat16", "cpu")),  # what runs wins over the settings
])
def test_model_runtime(device: str, workers: list[WorkerInfo], expected: tuple[str, str]) -> None:
    assert model_runtime(Settings(device=device), workers) == expected


def test_info_reads_the_workers_heartbeats(queue_service: RunningService) -> None:
    from redis import Redis

    def runtime() -> tuple[str, str]:
        got = httpx.get(queue_service.base_url + "/info", timeout=30).json()
        return got["model_dtype"], got["model_device_type"]

    assert runtime() == ("auto", "auto")  # no worker: --device auto, undecided
    keys = Keys(queue_service.env["CONVEYOR_KEY_PREFIX"])
    with Redis.from_url(queue_service.redis_url, decode_responses=True) as redis:
        redis.set(keys.worker("w-gpu"), worker("w-gpu", "cuda:0", "bfloat16").model_dump_json(), px=60_000)
        redis.set(keys.worker("w-bad"), "{}", px=60_000)  # not a heartbeat: skipped
        try:
            assert runtime() == ("bfloat16", "cuda")
        finally:
            redis.delete(keys.worker("w-gpu"), keys.worker("w-bad"))
    assert runtime() == ("auto", "auto")
