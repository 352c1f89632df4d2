"""From stream entries to engine requests (docs/design.md §1 steps 3, 7, 8).

A worker takes each entry it read or reclaimed: it becomes the job's owner (the record's `worker`
field), reads the job's event stream, and decides. A job already finished is only acknowledged; one
delivered more than max_attempts times is dead-lettered; a cancelled one ends `cancelled` with the
text it had; one whose deadline passed before any token ends `expired`. Everything else starts, or
resumes: the tokens in its event stream — the source of truth, whatever the dead worker had computed
but not written — are handed to the engine as already generated, and it continues at the next index.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import ValidationError
from redis.asyncio import Redis

from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.pubsub.publish import publish_to_followers
from conveyor.jobqueue.queue import Entry, EntryRef
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.wire.event_batch import dump_events, events_after
from conveyor.wire.job import JobEvent, JobResult, JobSpec, JobStatus, RecordField, Usage
from conveyor.worker.choices import Choices
from conveyor.worker.engine_thread import AddCommand
from conveyor.worker.owned import InFlight
from conveyor.worker.publisher import Publisher
from conveyor.worker.translate import engine_request

if TYPE_CHECKING:
    from conveyor.worker.observe import Observer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Taken:
    job: InFlight
    spec: JobSpec
    entry: Entry
    events: list[JobEvent] = field(default_factory=list)  # what the event stream holds, by index
    status: JobStatus = JobStatus.QUEUED  # the record's status when taken
    cancelled: bool = False
    seed: int | None = None

    @property
    def tokens(self) -> list[JobEvent]:
        return [e for e in self.events if e.token is not None]

    @property
    def finished(self) -> bool:
        """Its final record was written (by a worker that died before acknowledging, or by the api
        for a job it ended in the queue)."""
        return self.status.is_terminal or any(e.final for e in self.events)

    def partial_text(self) -> str:
        return "".join(e.token.text for e in self.tokens if e.token is not None and not e.token.special)


def parse(entry: Entry) -> JobSpec | str:
    """The entry's job spec, or why it cannot be read."""
    try:
        return JobSpec.model_validate_json(entry.fields.get("spec", ""))
    except ValidationError as exc:
        return f"the stream entry holds no valid job spec ({exc.error_count()} errors): it was not " \
               "written by this version's api; resubmit the job"


class Intake:
    def __init__(self, redis: Redis, keys: Keys, scripts: Scripts, publisher: Publisher,
                 worker_id: str, max_attempts: int, observer: Observer | None = None) -> None:
        self.redis = redis
        self.observer = observer
        self.keys = keys
        self.scripts = scripts
        self.publisher = publisher
        self.worker_id = worker_id
        self.max_attempts = max_attempts

    async def take(self, jobs: list[tuple[InFlight, JobSpec, Entry]]) -> list[Taken]:
        """Become the owner of each job and read its state; jobs whose record is gone are dropped
        (dead-lettered and acknowledged: there is nowhere left to write their result)."""
        now = time.time()

        def build(pipe) -> None:  # type: ignore[no-untyped-def]
            for job, spec, entry in jobs:
                may_start = entry.deliveries <= self.max_attempts
                expired = spec.deadline is not None and spec.deadline < now
                self.scripts.call(pipe, "take", [self.keys.job(job.job_id)],
                                  [self.worker_id, entry.deliveries, int(may_start), int(expired), now])
                pipe.xrange(self.keys.events(job.job_id))

        results = await self.scripts.execute(build)
        taken: list[Taken] = []
        for i, (job, spec, entry) in enumerate(jobs):
            record, stream = results[2 * i], results[2 * i + 1]
            for value in (record, stream):
                if isinstance(value, Exception):
                    raise value
            if record is None:
                await self.drop(entry, "the job's record is gone (expired or deleted): nothing to run")
                continue
            status, cancel, (started_at, first_token_at, seed, watched) = record
            events = sorted(events_after(stream, -1), key=lambda e: e.index)
            job.tokens = sum(1 for e in events if e.token is not None)
            if spec.width > 1:  # resumed per choice: conveyor/worker/choices.py
                job.choices = Choices.replay(spec.width, events, len(spec.prompt_ids))
            job.started_at = float(started_at) if started_at else None
            job.first_token_at = float(first_token_at) if first_token_at else None
            job.followers = set(watched.split()) if watched else set()
            taken.append(Taken(job, spec, entry, events, JobStatus(status or JobStatus.QUEUED),
                               cancelled=bool(cancel), seed=int(seed) if seed else spec.sampling.seed))
        return taken

    async def drop(self, entry: Entry, reason: str) -> None:
        log.error("dead-lettering stream entry %s: %s", entry.entry_id, reason)
        await self.publisher.dead_letter(entry, reason)
        await self.publisher.ack([entry.ref])

    async def decide(self, taken: list[Taken]) -> list[AddCommand]:
        """End what must end without the engine; return the requests to add to it."""
        now = time.time()
        ends: list[tuple[InFlight, JobEvent]] = []
        starts: list[tuple[Taken, AddCommand]] = []
        acks: list[EntryRef] = []
        for t in taken:
            failure = self._failure(t)
            if t.finished:  # only the acknowledgement was missing
                acks.append(t.job.ref)
            elif failure is not None:
                await self.publisher.dead_letter(t.entry, failure)
                ends.append((t.job, self._end(t, JobStatus.FAILED, failure)))
            elif t.cancelled:
                ends.append((t.job, self._end(t, JobStatus.CANCELLED)))
            elif t.status is JobStatus.QUEUED and t.spec.deadline is not None and t.spec.deadline < now:
                ends.append((t.job, self._end(t, JobStatus.EXPIRED)))
            else:
                starts.append((t, self._command(t)))
        await self.publisher.ack(acks)
        if ends:
            await self.publisher.publish(ends)
        if starts:
            await self._mark_started(starts)
        return [command for _t, command in starts]

    def _failure(self, t: Taken) -> str | None:
        if t.entry.deliveries > self.max_attempts:
            return (f"delivered {t.entry.deliveries} times (max_attempts={self.max_attempts}): each worker "
                    "that ran it stopped before finishing it; see the dead-letter stream and the workers' "
                    "logs, fix the cause, then resubmit")
        indices = [e.index for e in (t.events if t.job.choices is not None else t.tokens)]
        if indices != list(range(len(indices))):
            return ("the job's event stream lost tokens (was event_stream_maxlen lowered below "
                    "max_total_tokens?), so it cannot be resumed exactly; resubmit it")
        return None

    def _end(self, t: Taken, status: JobStatus, error: str | None = None) -> JobEvent:
        if t.job.choices is not None:
            return JobEvent.ending(t.job.next_index, t.job.choices.result(status, error))
        tokens = t.tokens
        result = JobResult.final(
            status, error=error, generated_text=t.partial_text(),
            usage=Usage(prompt_tokens=len(t.spec.prompt_ids), completion_tokens=len(tokens)), seed=t.seed,
        )
        return JobEvent.ending(len(tokens), result)

    def _command(self, t: Taken) -> AddCommand:
        if t.seed is None and t.spec.sampling.do_sample:
            # Fixed now and kept in the record: a resumed job draws token i from (seed, i) again.
            t.seed = random.getrandbits(63)
        generated = [e.token.id for e in t.tokens if e.token is not None]
        return engine_request(t.spec, t.seed, generated, queued=t.status is JobStatus.QUEUED,
                              choices=t.job.choices)

    async def _mark_started(self, starts: list[tuple[Taken, AddCommand]]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for t, _command in starts:
            if t.seed is not None:
                pipe.hset(self.keys.job(t.job.job_id), RecordField.SEED, t.seed)
            if t.tokens:
                # A resumed job: the dead worker may have written its last event without publishing
                # it. Publish it again (subscribers drop indices they have) so none sees a gap.
                last = dump_events([(t.events if t.job.choices is not None else t.tokens)[-1]])
                publish_to_followers(pipe, self.keys, {f: {t.job.job_id: last} for f in t.job.followers})
        if len(pipe):
            await pipe.execute()
        for t, _command in starts:
            if t.tokens:
                log.info("resuming job %s at token %d (delivery %d)", t.job.job_id, len(t.tokens),
                         t.entry.deliveries, extra={"job_id": t.job.job_id, "tenant": t.spec.tenant})
            elif self.observer is not None and t.status is JobStatus.QUEUED:
                self.observer.started(t.job, t.spec)
