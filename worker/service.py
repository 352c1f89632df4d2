"""The worker's production loop (DESIGN.md §1, steps 3–9).

Four asyncio tasks around one engine thread:
  read     pulls as many jobs from the consumer group as the engine can admit now;
  publish  writes each engine step's events in one pipeline and ends finished jobs;
  lease    heartbeat, lease renewal of its jobs, cancel flags, and reclaiming abandoned jobs;
  control  cancel requests, applied before the engine's next step.
`stop()` (SIGTERM/SIGINT) drains: no more reads, running jobs get `drain_timeout` to finish, what is
left is handed to the fleet, which resumes it from its events.
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
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engine.engine import Engine
from schemas.job import JobEvent, JobResult, JobStatus, RecordField
from schemas.keys import WORKER_GROUP, Keys
from schemas.settings import Settings
from schemas.worker import EngineLoad, WorkerInfo
from telemetry.tracing import Tracing
from webhooks.enqueue import WebhookQueue
from worker import faults
from worker.engine_thread import EngineThread, StepOutput
from worker.intake import Entry, Intake, parse
from worker.lease import Lease
from worker.metrics import WorkerMetrics
from worker.observe import Observer
from worker.publisher import InFlight, Publisher, to_job_event
from worker.scripts import Scripts

log = logging.getLogger(__name__)

READ_BLOCK_MS = 1000
_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)


def new_worker_id() -> str:
    return f"worker-{random.getrandbits(32):08x}"


async def ensure_group(redis: Redis, keys: Keys) -> None:
    with suppress(ResponseError):  # BUSYGROUP: it exists already
        await redis.xgroup_create(keys.jobs_stream, WORKER_GROUP, id="0", mkstream=True)


class Worker:
    def __init__(self, settings: Settings, engine: Engine, redis: Redis, worker_id: str | None = None,
                 model_name: str = "", tracing: Tracing | None = None) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.redis = redis
        self.worker_id = worker_id or new_worker_id()
        self.engine = engine
        self.model_name = model_name
        self.scripts = Scripts(redis)
        self.metrics = WorkerMetrics(self._stats, lambda: len(self.inflight), engine.config.block_size)
        self.webhooks = WebhookQueue(settings.redis_url, self.keys, settings) if settings.redis_url else None
        self.observer = Observer(self.worker_id, self.metrics, self.webhooks, tracing)
        self.publisher = Publisher(redis, self.keys, self.worker_id, self.scripts, settings.result_ttl,
                                   settings.event_stream_maxlen, self.observer)
        self.intake = Intake(redis, self.keys, self.scripts, self.publisher, self.worker_id,
                             settings.max_attempts, self.observer)
        self.lease = Lease(redis, self.keys, self.scripts, self.worker_id, settings.job_lease_ms)
        self.inflight: dict[str, InFlight] = {}
        self._outputs: asyncio.Queue[StepOutput] = asyncio.Queue()
        self._room = asyncio.Event()  # set when the engine may have room for more jobs
        self._idle = asyncio.Event()  # set while the worker owns no job
        self._idle.set()
        self._stop = asyncio.Event()
        self._draining = False
        self._fatal: BaseException | None = None
        self._thread: EngineThread | None = None
        self._crash_token = faults.crash_token()
        self._started_at = time.time()

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
        await self.scripts.load()
        loop = asyncio.get_running_loop()
        self._thread = EngineThread(self.engine, loop, self._outputs.put_nowait, self._fail,
                                    on_step=self.metrics.step)
        self._thread.start()
        await self.lease.beat(self.info())
        log.info("worker %s reading %s", self.worker_id, self.keys.jobs_stream)
        read = asyncio.create_task(self._guard("read", self._read_loop), name="read")
        others = [
            asyncio.create_task(self._publish_loop(), name="publish"),
            asyncio.create_task(self._guard("lease", self._lease_loop), name="lease"),
            asyncio.create_task(self._guard("control", self._control_loop), name="control"),
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
            for task in (stop, read, *others):
                task.cancel()
            await asyncio.gather(stop, read, *others, return_exceptions=True)
            await asyncio.to_thread(self.thread.stop)
            if self.webhooks is not None:
                await asyncio.to_thread(self.webhooks.close)
        if self._fatal is not None:
            # Its jobs stay pending: other workers resume them once the lease runs out.
            raise RuntimeError(f"worker {self.worker_id} failed") from self._fatal

    def _fail(self, exc: BaseException) -> None:
        self._fatal = exc
        self._stop.set()

    async def _drain(self, read: asyncio.Task[None]) -> None:
        self._draining = True
        timeout = self.settings.drain_timeout
        log.info("draining: no new jobs; %d running get %.0fs to finish", len(self.inflight), timeout)
        with suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(read), READ_BLOCK_MS / 1000 + 5)
        with suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        await asyncio.to_thread(self.thread.stop)
        with suppress(TimeoutError):  # publish what the engine computed before it stopped
            await asyncio.wait_for(self._outputs.join(), 30)
        left = list(self.inflight.values())
        if left:
            log.info("handing %d unfinished job(s) to other workers", len(left))
            await self.lease.release([job.entry_id for job in left])
            self.inflight.clear()
        await self.lease.leave()

    async def _guard(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Runs a loop; while Redis is unreachable, retries it with backoff instead of dying."""
        delay = 0.2
        while True:
            try:
                await loop()
                return
            except _REDIS_DOWN as exc:
                log.warning("%s: Redis unavailable (%s); retrying in %.1fs", name, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # --- taking jobs ------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        while not self._draining:
            room = self.thread.capacity()
            if room <= 0:
                self._room.clear()
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), timeout=0.5)
                continue
            try:
                streams = {self.keys.jobs_stream: ">"}
                reply = await self.redis.xreadgroup(WORKER_GROUP, self.worker_id, streams, count=room,
                                                    block=READ_BLOCK_MS)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await ensure_group(self.redis, self.keys)  # the stream was deleted under us
                continue
            entries = [Entry(eid, fields) for _stream, items in reply or [] for eid, fields in items]
            if self._draining:  # read while the drain began: hand them straight back
                await self.lease.release([e.entry_id for e in entries])
                return
            await self._admit(entries)

    async def _admit(self, entries: list[Entry]) -> None:
        jobs = []
        for entry in entries:
            spec = parse(entry)
            if isinstance(spec, str):
                await self.intake.drop(entry, spec)
                continue
            if spec.id in self.inflight:  # our own entry, reclaimed while it runs here: keep running
                continue
            job = InFlight(spec.id, entry.entry_id, spec.created_at, entry.deliveries, spec=spec)
            self.inflight[spec.id] = job  # before taking it, so a cancel meanwhile is not missed
            jobs.append((job, spec, entry))
        if not jobs:
            return
        self._idle.clear()
        started: set[str] = set()
        try:
            commands = await self.intake.decide(await self.intake.take(jobs))
            for command in commands:
                faults.maybe_crash(self._crash_token, command.prompt_ids)
            if commands:
                self.thread.add(*commands)  # together: they all join the engine's next step
            for command in commands:
                started.add(command.request_id)
                if (owned := self.inflight.get(command.request_id)) is not None and owned.cancel_requested:
                    self.thread.abort(command.request_id)
        finally:
            for job, _spec, _entry in jobs:
                if job.job_id not in started:
                    self._forget(job.job_id)

    def _forget(self, job_id: str) -> None:
        self.inflight.pop(job_id, None)
        if not self.inflight:
            self._idle.set()

    def _lose(self, job: InFlight) -> None:
        """Another worker owns the job now (this one hung past its lease): stop running it."""
        log.warning("job %s was taken over by another worker: dropping it here", job.job_id)
        self._forget(job.job_id)
        self.thread.abort(job.job_id)  # its final event finds no owner here and is dropped

    # --- publishing -------------------------------------------------------------------------

    async def _publish_loop(self) -> None:
        while True:
            output = await self._outputs.get()
            items: list[tuple[InFlight, JobEvent]] = []
            for event in output.events:
                job = self.inflight.get(event.request_id)
                if job is not None:  # else: lost or handed off; its new owner publishes
                    items.append((job, to_job_event(event)))
            for job_id, reason in output.rejected:
                job = self.inflight.get(job_id)
                if job is not None:
                    log.error("job %s refused by the engine: %s", job_id, reason)
                    result = JobResult(status=JobStatus.FAILED, finish_reason="error", error=reason)
                    items.append((job, JobEvent(index=job.tokens, final=True, result=result)))
            if items:
                await self._publish(items)
            self._outputs.task_done()
            self._room.set()

    async def _publish(self, items: list[tuple[InFlight, JobEvent]]) -> None:
        delay = 0.1
        while True:
            try:
                published = await self.publisher.publish(items)
                break
            except _REDIS_DOWN as exc:  # every write of a step is idempotent: retry it whole
                log.warning("publish: Redis unavailable (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        for job in published.ended:
            self._forget(job.job_id)
        for job in published.lost:
            self._lose(job)

    # --- lease, heartbeat, cancel -----------------------------------------------------------

    def _stats(self):  # type: ignore[no-untyped-def]
        return self._thread.stats if self._thread is not None else self.engine.stats()

    def info(self) -> WorkerInfo:
        runner = self.engine.runner
        stats = self._stats()
        return WorkerInfo(
            id=self.worker_id, pid=os.getpid(), host=socket.gethostname(), model=self.model_name,
            device=str(getattr(runner, "device", "cpu")),
            dtype=str(getattr(runner, "dtype", "")).removeprefix("torch."),
            kv_blocks=self.engine.block_manager.num_blocks, block_size=self.engine.config.block_size,
            max_batch_size=self.engine.config.max_batch_size, started_at=self._started_at,
            heartbeat_at=time.time(), draining=self._draining, jobs=len(self.inflight),
            load=EngineLoad(**{name: getattr(stats, name) for name in EngineLoad.model_fields}),
        )

    async def _lease_loop(self) -> None:
        interval = self.settings.heartbeat_interval_ms / 1000
        while True:
            await self.lease.beat(self.info())
            jobs = list(self.inflight.values())
            lost = await self.lease.renew([job.entry_id for job in jobs])
            for job in jobs:
                if job.entry_id in lost and self.inflight.get(job.job_id) is job:
                    self._lose(job)
            await self._check_cancels()
            if not self._draining and (room := self.thread.capacity()) > 0:
                entries = await self.lease.reclaim(room)
                if entries:
                    self.observer.reclaimed(len(entries))
                    await self._admit(entries)
            await asyncio.sleep(interval)

    async def _check_cancels(self) -> None:
        """Pub/sub is at-most-once: a cancel message lost on the way is caught here, from its flag."""
        jobs = [job for job in self.inflight.values() if not job.cancel_requested]
        if not jobs:
            return
        pipe = self.redis.pipeline(transaction=False)
        for job in jobs:
            pipe.hget(self.keys.job(job.job_id), RecordField.CANCEL)
        for job, flag in zip(jobs, await pipe.execute(), strict=True):
            if flag:
                self._cancel(job)

    def _cancel(self, job: InFlight) -> None:
        job.cancel_requested = True
        self.thread.abort(job.job_id)  # applied before the engine's next step

    async def _control_loop(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(self.keys.control_channel)
        try:
            async for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                job = self.inflight.get(message["data"])
                if job is not None:
                    self._cancel(job)
        finally:
            await pubsub.aclose()
