"""Turns a step's events into Redis writes: one pipeline per step, never one round trip per token.

Every event goes through the APPEND script, which writes only while this worker owns the job (the
record's `worker` field): a worker that lost a job to another — it hung past its lease — learns so
at its next write and stops, and can never interleave its events with the new owner's. A job's
entry in its jobs stream is acknowledged (and deleted) only after its final record is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from conveyor.jobqueue.keys import DEAD_LETTER_MAXLEN, WORKER_GROUP, Keys, event_entry_id
from conveyor.jobqueue.queue import Entry, EntryRef, by_stream
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.wire.job import JobEvent, JobResult
from conveyor.worker.owned import InFlight

if TYPE_CHECKING:
    from conveyor.worker.observe import Observer


@dataclass(slots=True)
class Published:
    ended: list[InFlight] = field(default_factory=list)  # final record written, entry acknowledged
    lost: list[InFlight] = field(default_factory=list)  # owned by another worker now: stop running it


class Publisher:
    def __init__(self, redis: Redis, keys: Keys, worker_id: str, scripts: Scripts, result_ttl: int,
                 event_stream_maxlen: int, observer: Observer | None = None) -> None:
        self.redis = redis
        self.observer = observer
        self.keys = keys
        self.worker_id = worker_id
        self.scripts = scripts
        self.result_ttl = result_ttl
        self.maxlen = event_stream_maxlen

    async def publish(self, items: list[tuple[InFlight, JobEvent]]) -> Published:
        """Writes one step's events in one pipeline, then acknowledges the jobs that ended."""
        now = time.time()
        for job, event in items:
            event.at = round(now, 3)
            if event.token is not None:
                job.tokens = max(job.tokens, event.index + 1)
                if job.first_token_at is None:
                    job.first_token_at = now
            if event.result is not None:
                event.result.timings = job.timings(now)

        def build(pipe: Pipeline) -> None:
            for job, event in items:
                self._append(pipe, job.job_id, event, now)

        results = await self.scripts.execute(build)
        out = Published()
        finals: list[tuple[InFlight, JobResult]] = []
        for (job, event), result in zip(items, results, strict=True):
            if isinstance(result, Exception):
                raise result
            if result == 0:
                out.lost.append(job)
            elif event.final:
                job.ended = True  # before the ack: the lease loop must not read it as lost
                out.ended.append(job)
                if event.result is not None:
                    finals.append((job, event.result))
        await self.ack([job.ref for job in out.ended])
        if self.observer is not None:
            for job, job_result in finals:
                self.observer.ended(job, job_result)
        return out

    def _append(self, pipe: Pipeline, job_id: str, event: JobEvent, now: float) -> None:
        result = event.result
        first = event.token is not None and event.index == 0  # the first-token milestone
        status = result.status.value if result else ""
        result_json = result.model_dump_json(exclude_none=True) if result else ""
        self.scripts.call(
            pipe, "append", [self.keys.job(job_id), self.keys.events(job_id)],
            [self.worker_id, event_entry_id(event.index), event.model_dump_json(exclude_none=True),
             self.maxlen, self.keys.channel(job_id), now, int(first), int(event.final), status, result_json,
             self.result_ttl],
        )

    async def ack(self, refs: list[EntryRef]) -> None:
        """Acknowledge and delete entries of the jobs streams: they keep only unfinished jobs. One
        pipeline, one stream per command (one slot each on Redis Cluster)."""
        streams = by_stream(ref for ref in refs if ref[0])
        if not streams:
            return
        pipe = self.redis.pipeline(transaction=False)
        for stream, entry_ids in streams.items():
            pipe.xack(stream, WORKER_GROUP, *entry_ids)
            pipe.xdel(stream, *entry_ids)
        await pipe.execute()

    async def dead_letter(self, entry: Entry, reason: str) -> None:
        """Copy an entry to the dead-letter stream; the caller then ends the job and acknowledges."""
        await self.redis.xadd(
            self.keys.dead_letter_stream,
            {**entry.fields, "entry_id": entry.entry_id, "stream": entry.stream,
             "deliveries": entry.deliveries, "reason": reason, "worker": self.worker_id, "at": time.time()},
            maxlen=DEAD_LETTER_MAXLEN, approximate=True,
        )
        if self.observer is not None:
            self.observer.dead_lettered()
