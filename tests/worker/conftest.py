"""Fixtures for the worker's integration tests: workers as real processes (`python -m conveyor.launcher.cli
worker`) or in this process, on the tiny random Llama (`tiny_model_dir`, tests/conftest.py: fast on
CPU, the real code path), the real valkey-server, and jobs submitted exactly as the api writes them
(conveyor.api.jobpath.store.JobStore)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.keys import WORKER_GROUP, Keys
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.settings import Settings
from conveyor.wire.event_batch import events_after, load_events
from conveyor.wire.heartbeat import WorkerInfo
from conveyor.wire.job import JobEvent, JobResult, JobSpec, JobStatus, RecordField, SamplingSpec, StoppingSpec
from conveyor.worker.hung_tasks import awaited_chain
from tests.readiness import await_until

FOLLOWER = "tests-api"  # the api process that follows the jobs Jobs.submit submits followed

REPO = Path(__file__).resolve().parents[2]
# Test timing: a worker that misses its heartbeats for 2 s loses its jobs to the others.
LEASE_MS = 2000
HEARTBEAT_MS = 250
KV_CACHE = "8MiB"  # 1024 blocks of 16 tokens for the tiny model


def new_spec(prompt_ids: list[int], max_new_tokens: int = 8, **kwargs: Any) -> JobSpec:
    """A greedy job that runs exactly max_new_tokens tokens (EOS ignored)."""
    return JobSpec(id=uuid.uuid4().hex, created_at=time.time(), prompt_ids=prompt_ids,
                   stopping=StoppingSpec(max_new_tokens=max_new_tokens, ignore_eos=True),
                   sampling=SamplingSpec(), **kwargs)


@pytest.fixture
def make_spec() -> Callable[..., JobSpec]:
    return new_spec


@dataclass
class Jobs:
    """The client side of one key prefix: submit as the api does, then read what workers wrote."""

    redis: Redis
    keys: Keys
    settings: Settings

    async def submit(self, spec: JobSpec, followed: bool = True) -> str:
        """As a sync or streaming request does (followed, by the api process FOLLOWER, whose channel
        is keys.live(FOLLOWER)), or an async job or Batch line (not)."""
        store = JobStore(self.redis, self.keys, self.settings, follower=FOLLOWER)
        await store.submit(spec, followed=followed)
        return spec.id

    async def record(self, job_id: str) -> dict[str, str]:
        return await self.redis.hgetall(self.keys.job(job_id))

    async def result(self, job_id: str, timeout: float = 120) -> JobResult:
        """The job's final result, once its record is terminal."""
        deadline = time.monotonic() + timeout
        while True:
            record = await self.record(job_id)
            if record.get(RecordField.STATUS) and JobStatus(record[RecordField.STATUS]).is_terminal:
                return JobResult.model_validate_json(record[RecordField.RESULT])
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} not finished after {timeout}s: {record}\n{self.logs()}")
            await asyncio.sleep(0.05)

    async def events(self, job_id: str) -> list[JobEvent]:
        entries = await self.redis.xrange(self.keys.events(job_id))
        return events_after(entries, -1)

    async def wait_events(self, job_id: str, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while await self.written(job_id) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id}: fewer than {n} events after {timeout}s\n{self.logs()}")
            await asyncio.sleep(0.02)

    async def written(self, job_id: str) -> int:
        """Events written so far: the last entry's last index + 1 (an entry holds a step's or a stream
        interval's events, conveyor/wire/event_batch.py)."""
        tail = await self.redis.xrevrange(self.keys.events(job_id), count=1)
        return load_events(tail[0][1]["e"])[-1].index + 1 if tail else 0

    async def wait_idle_past_lease(self, lease_ms: int, timeout: float = 60) -> None:
        """Until Redis shows an entry idle for longer than `lease_ms`: a dead worker's lease ran out."""
        deadline = time.monotonic() + timeout
        while not await self.pending_rows(idle=lease_ms):
            if time.monotonic() > deadline:
                raise AssertionError(f"no entry idle past {lease_ms} ms after {timeout}s\n{self.logs()}")
            await asyncio.sleep(0.05)

    async def pending(self) -> int:
        """Entries read and not acknowledged, over every jobs stream."""
        streams = self.keys.jobs_streams
        return sum([int((await self.redis.xpending(s, WORKER_GROUP))["pending"]) for s in streams])

    async def pending_rows(self, count: int = 100, **kwargs: Any) -> list[dict[str, Any]]:
        """XPENDING's rows over every jobs stream, each with its `stream`."""
        return [{**row, "stream": stream} for stream in self.keys.jobs_streams
                for row in await self.redis.xpending_range(stream, WORKER_GROUP, "-", "+", count, **kwargs)]

    async def queued(self) -> int:
        """Entries in the jobs streams (acknowledged ones are deleted)."""
        return sum([await self.redis.xlen(stream) for stream in self.keys.jobs_streams])

    def use_shards(self, shards: int) -> None:
        """Split the queue into `shards` (before any worker starts)."""
        self.keys = Keys(self.keys.prefix, shards)
        self.settings = self.settings.model_copy(update={"jobs_shards": shards})
        if isinstance(self, Fleet):
            self.env["CONVEYOR_JOBS_SHARDS"] = str(shards)

    async def info(self, worker_id: str) -> WorkerInfo:
        raw = await self.redis.get(self.keys.worker(worker_id))
        if raw is None:
            raise AssertionError(f"no heartbeat from {worker_id}\n{self.logs()}")
        return WorkerInfo.model_validate_json(raw)

    async def check_events(self, job_id: str, n: int) -> list[JobEvent]:
        """Indices 0..n-1, each exactly once, in order, all tokens; the last one final."""
        events = await self.events(job_id)
        assert [e.index for e in events] == list(range(n)), [e.index for e in events]
        assert all(e.token is not None for e in events)
        assert [e.final for e in events] == [False] * (n - 1) + [True]
        return events

    def logs(self) -> str:
        return ""


@dataclass
class Fleet(Jobs):
    """Worker processes sharing one key prefix on the test Redis."""

    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = Path(".")
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, *worker_ids: str, **env: str) -> None:
        for worker_id in worker_ids:
            log = open(self.log_dir / f"{worker_id}.log", "ab")  # noqa: SIM115 - closed with the process
            self.procs[worker_id] = subprocess.Popen(
                [sys.executable, "-m", "conveyor", "worker", "--worker-id", worker_id],
                env={**self.env, **env}, cwd=REPO, stdout=log, stderr=log,
            )

    async def wait_ready(self) -> None:
        """Until every started worker's heartbeat is live; fails at once if one exits first."""
        async def all_beat() -> bool:
            return all([await self.redis.exists(self.keys.worker(w)) for w in self.procs])

        await await_until(all_beat, f"the heartbeats of {', '.join(self.procs)}", self.procs, self.logs)

    def signal(self, worker_id: str, sig: int) -> None:
        self.procs[worker_id].send_signal(sig)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.log_dir.glob("*.log")))

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _prefix() -> str:
    return f"wt{uuid.uuid4().hex[:8]}"


def new_fleet(redis: Redis, redis_url: str, model_dir: Path, log_dir: Path) -> Fleet:
    """Worker processes on their own key prefix of the Redis at `redis_url` (`redis`: a client of it)."""
    prefix = _prefix()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")},
        "REDIS_URL": redis_url,
        "CONVEYOR_MODEL": str(model_dir),
        "CONVEYOR_KEY_PREFIX": prefix,
        "CONVEYOR_KV_CACHE_MEMORY": KV_CACHE,
        "CONVEYOR_JOB_LEASE_MS": str(LEASE_MS),
        "CONVEYOR_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
        "CONVEYOR_DRAIN_TIMEOUT": "10",
        "CONVEYOR_LOG_LEVEL": "info",
        "CONVEYOR_WORKER_METRICS_PORT": "0",  # several workers on one host: no fixed port
        "OMP_NUM_THREADS": "1",  # two cores for everyone: workers must not fight over threads
    }
    settings = Settings(redis_url=redis_url, key_prefix=prefix, max_concurrent_requests=100_000)
    return Fleet(redis, Keys(prefix), settings, env=env, log_dir=log_dir)


@pytest.fixture
async def fleet(redis, redis_server: EmbeddedRedis, tiny_model_dir: Path,  # type: ignore[no-untyped-def]
                tmp_path: Path) -> AsyncIterator[Fleet]:
    running = new_fleet(redis, redis_server.url, tiny_model_dir, tmp_path)
    yield running
    await asyncio.to_thread(running.stop)


@dataclass
class Local(Jobs):
    """Workers in this process (fast to start), for the paths that need no process to die."""

    model_dir: Path = Path(".")
    redis_url: str = ""

    def engine(self, **config: Any) -> Any:
        from conveyor.engine.config import EngineConfig
        from conveyor.engine.engine import Engine

        return Engine.from_pretrained(self.model_dir, EngineConfig(**{"kv_cache_memory": 8 << 20, **config}))

    @asynccontextmanager
    async def worker(self, worker_id: str = "local", engine: Any = None,
                     **settings: Any) -> AsyncIterator[Any]:
        from conveyor.worker.outage import connect
        from conveyor.worker.runner import Worker

        client = connect(self.settings)  # as `conveyor worker` makes it
        worker = Worker(self.settings.model_copy(update=settings), engine or self.engine(), client, worker_id)
        task = asyncio.create_task(worker.run())
        try:
            while not await self.redis.exists(self.keys.worker(worker_id)):
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
            yield worker
        finally:
            worker.stop()
            done, _ = await asyncio.wait({task}, timeout=60)
            if not done:  # say where it hangs before failing: every task's stack, then cancel it
                stacks = "\n".join(awaited_chain(running) for running in asyncio.all_tasks())
                task.cancel()
                raise AssertionError(f"worker {worker_id} did not stop within 60 s:\n{stacks}")
            task.result()
            await client.aclose()


@pytest.fixture
async def local(redis, redis_server: EmbeddedRedis, tiny_model_dir: Path) -> Local:  # type: ignore[no-untyped-def]
    prefix = _prefix()
    settings = Settings(redis_url=redis_server.url, key_prefix=prefix, max_concurrent_requests=100_000,
                        job_lease_ms=600, heartbeat_interval_ms=100, drain_timeout=5, max_attempts=2)
    return Local(redis, Keys(prefix), settings, model_dir=tiny_model_dir, redis_url=redis_server.url)
