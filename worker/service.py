"""The worker's production loop (DESIGN.md §1, steps 3–5 and 7).

Pulls as many jobs from the consumer group as the engine can admit now, feeds them to the engine
thread, and publishes each step's events in one pipeline.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from contextlib import suppress

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from engine.engine import Engine
from engine.events import TokenEvent
from engine.params import SamplingParams, StoppingParams
from schemas.job import JobEvent, JobResult, JobSpec, JobStatus, RecordField
from schemas.keys import WORKER_GROUP, Keys
from schemas.settings import Settings
from worker.engine_thread import AddCommand, EngineThread
from worker.publisher import InFlight, Publisher, to_job_event

log = logging.getLogger(__name__)

READ_BLOCK_MS = 1000


def engine_params(spec: JobSpec) -> tuple[SamplingParams, StoppingParams]:
    s = spec.sampling
    sampling = SamplingParams(
        do_sample=s.do_sample, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
        typical_p=s.typical_p, repetition_penalty=s.repetition_penalty,
        frequency_penalty=s.frequency_penalty, presence_penalty=s.presence_penalty,
        seed=s.seed, top_n_tokens=s.top_n_tokens,
    )
    stopping = StoppingParams(
        max_new_tokens=spec.stopping.max_new_tokens,
        stop=tuple(spec.stopping.stop),
        ignore_eos=spec.stopping.ignore_eos,
    )
    return sampling, stopping


async def ensure_group(redis: Redis, keys: Keys) -> None:
    with suppress(ResponseError):  # BUSYGROUP: it exists already
        await redis.xgroup_create(keys.jobs_stream, WORKER_GROUP, id="0", mkstream=True)


class Worker:
    def __init__(self, settings: Settings, engine: Engine, redis: Redis, worker_id: str | None = None) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.redis = redis
        self.worker_id = worker_id or f"worker-{random.getrandbits(32):08x}"
        self.engine = engine
        self.publisher = Publisher(redis, self.keys, settings.result_ttl, settings.event_stream_maxlen)
        self.inflight: dict[str, InFlight] = {}
        self._events: asyncio.Queue[list[TokenEvent]] = asyncio.Queue()
        self._room = asyncio.Event()  # set when the engine may have room for more jobs
        self._stopping = asyncio.Event()
        self._engine_error: BaseException | None = None
        self._thread: EngineThread | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._thread = EngineThread(self.engine, loop, self._events.put_nowait, self._fail)
        self._thread.start()
        await ensure_group(self.redis, self.keys)
        log.info("worker %s reading %s", self.worker_id, self.keys.jobs_stream)
        tasks = [
            asyncio.create_task(self._read_loop(), name="read"),
            asyncio.create_task(self._publish_loop(), name="publish"),
            asyncio.create_task(self._control_loop(), name="control"),
        ]
        try:
            await self._stopping.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._thread.stop()
        if self._engine_error is not None:
            raise RuntimeError("engine failed") from self._engine_error

    def stop(self) -> None:
        self._stopping.set()

    def _fail(self, exc: BaseException) -> None:
        self._engine_error = exc
        self._stopping.set()

    async def _read_loop(self) -> None:
        assert self._thread is not None
        while True:
            room = self._thread.capacity()
            if room <= 0:
                self._room.clear()
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), timeout=0.5)
                continue
            reply = await self.redis.xreadgroup(
                WORKER_GROUP, self.worker_id, {self.keys.jobs_stream: ">"}, count=room, block=READ_BLOCK_MS
            )
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    await self._start(entry_id, fields)

    async def _start(self, entry_id: str, fields: dict[str, str]) -> None:
        assert self._thread is not None
        spec = JobSpec.model_validate_json(fields["spec"])
        record = self.keys.job(spec.id)
        cancelled = await self.redis.hget(record, RecordField.CANCEL)
        self.inflight[spec.id] = InFlight(entry_id=entry_id)
        if cancelled:
            await self._end_without_engine(spec.id, JobStatus.CANCELLED, 0)
            return
        if spec.deadline is not None and spec.deadline < time.time():
            await self._end_without_engine(spec.id, JobStatus.EXPIRED, 0)
            return
        await self.redis.hset(
            record,
            mapping={
                RecordField.STATUS: JobStatus.RUNNING.value,
                RecordField.STARTED_AT: time.time(),
                RecordField.WORKER: self.worker_id,
            },
        )
        sampling, stopping = engine_params(spec)
        self._thread.add(
            AddCommand(spec.id, spec.prompt_ids, sampling, stopping, spec.priority, spec.deadline)
        )

    async def _end_without_engine(self, job_id: str, status: JobStatus, index: int) -> None:
        event = JobEvent(index=index, final=True, result=JobResult(status=status, finish_reason=status.value))
        await self.publisher.publish([(job_id, event)], self.inflight)
        self.inflight.pop(job_id, None)

    async def _publish_loop(self) -> None:
        while True:
            events = await self._events.get()
            items = [(e.request_id, to_job_event(e)) for e in events]
            ended = await self.publisher.publish(items, self.inflight)
            for job_id in ended:
                self.inflight.pop(job_id, None)
            self._room.set()

    async def _control_loop(self) -> None:
        """Cancel requests: abort a running job within one engine step."""
        assert self._thread is not None
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(self.keys.control_channel)
        try:
            async for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                job_id = message["data"]
                if job_id in self.inflight:
                    self._thread.abort(job_id)
        finally:
            await pubsub.aclose()
