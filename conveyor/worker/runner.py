"""The worker process's main loop (docs/design.md §1, steps 3–9).

Four asyncio tasks around one engine thread, one module each:
  read     (read_loop.py)     pulls as many jobs from the consumer group as the engine can admit now;
  publish  (publish_loop.py)  writes each engine step's events in one pipeline and ends finished jobs;
  lease    (lease_loop.py)    renews its jobs' leases, heartbeats, re-reads cancel flags, reclaims
                              abandoned jobs;
  control  (control_loop.py)  cancel requests, applied before the engine's next step.
While Redis is unreachable each loop is retried (conveyor/worker/outage.py), never left dead. `stop()`
(SIGTERM/SIGINT) drains: no more reads, running jobs get `drain_timeout` to finish, what is left is
handed to the fleet, which resumes it from its events.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress

from redis.asyncio import Redis

from conveyor.engine.engine import Engine
from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.queue import ensure_group
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.jobqueue.spread import check_spread
from conveyor.settings import Settings
from conveyor.telemetry.tracing import Tracing
from conveyor.webhooks.enqueue import webhook_queue
from conveyor.wire.heartbeat import EngineLoad, WorkerInfo
from conveyor.worker import faults
from conveyor.worker.control_loop import ControlLoop
from conveyor.worker.engine_thread import EngineThread, StepOutput
from conveyor.worker.hung_tasks import cancel_all
from conveyor.worker.intake import Intake
from conveyor.worker.lease import Lease
from conveyor.worker.lease_loop import LeaseLoop
from conveyor.worker.liveness import Liveness, Ticker
from conveyor.worker.metrics import WorkerMetrics
from conveyor.worker.observe import Observer
from conveyor.worker.outage import outage_cap, until_up
from conveyor.worker.owned import InFlight, Owned
from conveyor.worker.placement import WorkerAffinity
from conveyor.worker.publish_loop import PublishLoop
from conveyor.worker.publisher import Publisher
from conveyor.worker.queue_reader import READ_BLOCK_MS, QueueReader
from conveyor.worker.read_loop import ReadLoop

log = logging.getLogger(__name__)

# How long a stopping worker waits for its cancelled loops (they end at their next await).
CANCEL_GRACE_S = 10.0


def new_worker_id() -> str:
    return f"worker-{random.getrandbits(32):08x}"


class Worker:
    def __init__(self, settings: Settings, engine: Engine, redis: Redis, worker_id: str | None = None,
                 model_name: str = "", tracing: Tracing | None = None) -> None:
        self.settings = settings
        # Only its model's queue (conveyor/jobqueue/models.py): None, the default model's, unless
        # started with worker_model. Reading, affinity, sweeping and resuming all stay within it.
        self.keys = Keys(settings.key_prefix, settings.jobs_shards, settings.worker_model)
        self.redis = redis
        self.worker_id = worker_id or new_worker_id()
        self.engine = engine
        self.model_name = settings.worker_model or model_name
        self.aliases = sorted(a for a, name in settings.model_alias_map.items() if name == self.model_name)
        self.scripts = Scripts(redis)
        self.owned = Owned()
        self.metrics = WorkerMetrics(self._stats, lambda: len(self.owned), engine.config.block_size,
                                     self.model_name)
        self.webhooks = webhook_queue(settings, self.keys)
        self.observer = Observer(self.worker_id, self.metrics, self.webhooks, tracing)
        self.publisher = Publisher(redis, self.keys, self.worker_id, self.scripts, settings.result_ttl,
                                   settings.event_stream_maxlen, self.observer, settings.events_ttl)
        self.intake = Intake(redis, self.keys, self.scripts, self.publisher, self.worker_id,
                             settings.max_attempts, self.observer)
        self.affinity = WorkerAffinity(redis, self.keys, self.scripts, self.worker_id, settings.affinity,
                                       settings.affinity_wait_ms, settings.job_lease_ms,
                                       engine.config.block_size)
        self.lease = Lease(redis, self.keys, self.scripts, self.worker_id, settings.job_lease_ms,
                           self.affinity.streams)
        self.outage_cap = outage_cap(settings)
        self._outputs: asyncio.Queue[StepOutput] = asyncio.Queue()
        self._stop = asyncio.Event()
        self._draining = False
        self._publishing: PublishLoop | None = None
        self._fatal: BaseException | None = None
        self._thread: EngineThread | None = None
        self._crash_token = faults.crash_token()
        self._started_at = time.time()
        # /health on the metrics port (conveyor/worker/liveness.py): both loops must make progress.
        self._ticker = Ticker()
        self.liveness = Liveness(settings.worker_stall_timeout)
        self.liveness.watch("engine", self._engine_progress)
        self.liveness.watch("asyncio", lambda: self._ticker.at)

    @property
    def thread(self) -> EngineThread:
        if self._thread is None:
            raise RuntimeError("the worker is not running: call run() first")
        return self._thread

    def stop(self) -> None:
        """Drain and exit (the first SIGTERM/SIGINT)."""
        self._stop.set()

    async def run(self) -> None:
        await ensure_group(self.redis, self.keys)
        await check_spread(self.redis, self.keys)
        await self.scripts.load()
        await self.affinity.register()
        loop = asyncio.get_running_loop()
        self._thread = EngineThread(self.engine, loop, self._outputs.put_nowait, self._fail,
                                    on_step=self.metrics.step)
        self._thread.start()
        reader = ReadLoop(self.redis, self.keys, self.worker_id, self._thread, self.intake, self.lease,
                          self.owned, self._is_draining, self._crash_token,
                          QueueReader(self.redis, self.keys, self.scripts, self.worker_id,
                                      self.settings.band_starvation_every, self.affinity),
                          self.affinity, self.metrics.placed)
        publisher = self._publishing = PublishLoop(
            self.publisher, self.owned, self._outputs, reader.room, self._lose, self.outage_cap,
            self.metrics.redis_error, self.settings.stream_interval_ms / 1000,
            self.settings.durable_interval_ms / 1000)
        control = ControlLoop(self.redis, self.keys, self.owned, self._thread, publisher.followed)
        leases = LeaseLoop(self.lease, self.owned, self._thread, control, reader.admit, self.info,
                           self.observer, self._lose, self._is_draining,
                           self.settings.heartbeat_interval_ms / 1000, self.affinity)
        await self.lease.beat(self.info())
        await self.affinity.beat(self._thread, self.settings.heartbeat_interval_ms / 1000)
        log.info("worker %s of model %s reading %d jobs stream(s) (%d shard(s) × bands)", self.worker_id,
                 self.model_name or "(default)", len(self.keys.jobs_streams), self.keys.jobs_shards)
        read = asyncio.create_task(self._guard("read", reader.run), name="read")
        others = [
            asyncio.create_task(publisher.run(), name="publish"),
            asyncio.create_task(self._guard("lease", leases.run), name="lease"),
            asyncio.create_task(self._guard("control", control.run), name="control"),
            asyncio.create_task(self._ticker.run(), name="liveness"),
        ]
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait([stop, read, *others], return_when=asyncio.FIRST_COMPLETED)
        for task in (read, *others):
            if task.done() and not task.cancelled() and task.exception() is not None:
                self._fatal = self._fatal or task.exception()
        try:
            if self._fatal is None:
                await self._drain(read)
        finally:
            await cancel_all((stop, read, *others), CANCEL_GRACE_S, f"worker {self.worker_id}")
            await asyncio.to_thread(self.thread.stop)
            if self.webhooks is not None:
                await asyncio.to_thread(self.webhooks.close)
        if self._fatal is not None:
            # Its jobs stay pending: other workers resume them once the lease runs out.
            raise RuntimeError(f"worker {self.worker_id} failed") from self._fatal

    def _is_draining(self) -> bool:
        return self._draining

    def _fail(self, exc: BaseException) -> None:
        self._fatal = exc
        self._stop.set()

    async def _drain(self, read: asyncio.Task[None]) -> None:
        self._draining = True
        await self.affinity.withdraw()  # the api places nothing more here
        timeout = self.settings.drain_timeout
        log.info("draining: no new jobs; %d running get %.0fs to finish", len(self.owned), timeout)
        # asyncio.timeout, not wait_for, which on Python 3.11 may drop a cancel (conveyor/worker/placement.py)
        with suppress(TimeoutError):
            async with asyncio.timeout(READ_BLOCK_MS / 1000 + 5):
                await asyncio.shield(read)
        with suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.owned.idle.wait()
        await asyncio.to_thread(self.thread.stop)
        with suppress(TimeoutError):  # publish what the engine computed before it stopped
            async with asyncio.timeout(30):
                await self._outputs.join()
                if self._publishing is not None:
                    await self._publishing.flush()
        left = self.owned.jobs()
        if left:
            log.info("handing %d unfinished job(s) to other workers", len(left))
            await self.lease.release([job.ref for job in left])
            self.owned.clear()
        await self.affinity.leave()
        await self.lease.leave()

    async def _guard(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Runs a loop; while Redis is unreachable, restarts it (after a backoff) instead of dying."""
        await until_up(name, loop, self.outage_cap, self.metrics.redis_error)

    def _lose(self, job: InFlight) -> None:
        """Another worker owns the job now (this one hung past its lease): stop running it."""
        log.warning("job %s was taken over by another worker: dropping it here", job.job_id)
        self.owned.forget(job.job_id)
        self.thread.abort(job.job_id)  # its final event finds no owner here and is dropped

    def _engine_progress(self) -> float | None:
        return self._thread.progress_at() if self._thread is not None else None

    def _stats(self) -> EngineLoad:
        return self._thread.stats if self._thread is not None else self.engine.stats()

    def info(self) -> WorkerInfo:
        runner = self.engine.runner
        return WorkerInfo(
            id=self.worker_id, pid=os.getpid(), host=socket.gethostname(), model=self.model_name,
            aliases=self.aliases,
            device=str(getattr(runner, "device", "cpu")),
            dtype=_dtype(runner),
            kv_blocks=self.engine.block_manager.num_blocks, block_size=self.engine.config.block_size,
            max_batch_size=self.engine.config.max_batch_size, started_at=self._started_at,
            heartbeat_at=time.time(), draining=self._draining, jobs=len(self.owned), load=self._stats(),
        )


def _dtype(runner: object) -> str:
    """The worker's dtype as /info and the console show it: e.g. `float32`, or `float32 (bfloat16
    GEMMs)` under --gemm-dtype bfloat16 (no comma: /info joins differing workers' with commas)."""
    name = str(getattr(runner, "dtype", "")).removeprefix("torch.")
    gemm = getattr(runner, "gemm_dtype_name", "")
    return f"{name} ({gemm} GEMMs)" if gemm else name
