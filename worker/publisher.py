"""Turns a step's engine events into Redis writes: one pipeline per step, never one per token."""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from engine.events import TokenEvent
from engine.sequence import FinishReason
from schemas.job import EventToken, JobEvent, JobResult, JobStatus, RecordField, Usage
from schemas.keys import WORKER_GROUP, Keys

_STATUS_BY_REASON = {
    FinishReason.EOS: JobStatus.SUCCEEDED,
    FinishReason.LENGTH: JobStatus.SUCCEEDED,
    FinishReason.STOP_SEQUENCE: JobStatus.SUCCEEDED,
    FinishReason.ABORTED: JobStatus.CANCELLED,
    FinishReason.EXPIRED: JobStatus.EXPIRED,
}


@dataclass(slots=True)
class InFlight:
    """A job this worker has read from the stream and not yet acknowledged."""

    entry_id: str
    first_token_seen: bool = False


def to_job_event(event: TokenEvent) -> JobEvent:
    token = None
    if event.token_id is not None:
        token = EventToken(id=event.token_id, text=event.text, logprob=event.logprob, special=event.special)
    result = None
    if event.finish_reason is not None:
        reason = event.finish_reason
        status = _STATUS_BY_REASON[reason]
        result = JobResult(
            status=status,
            generated_text=event.generated_text or "",
            finish_reason=reason.value if status is JobStatus.SUCCEEDED else status.value,
            usage=Usage(
                prompt_tokens=event.num_prompt_tokens,
                completion_tokens=event.num_generated_tokens,
                cached_tokens=event.num_cached_tokens,
            ),
            seed=event.seed,
        )
    return JobEvent(
        index=event.index,
        token=token,
        top_tokens=[EventToken(id=t.id, text=t.text, logprob=t.logprob, special=t.special)
                    for t in event.top_tokens],
        final=result is not None,
        result=result,
    )


class Publisher:
    def __init__(self, redis: Redis, keys: Keys, result_ttl: int, event_stream_maxlen: int) -> None:
        self.redis = redis
        self.keys = keys
        self.result_ttl = result_ttl
        self.maxlen = event_stream_maxlen

    async def publish(self, items: list[tuple[str, JobEvent]], inflight: dict[str, InFlight]) -> list[str]:
        """Writes one step's events in one pipeline; returns the ids of jobs that ended."""
        now = time.time()
        pipe = self.redis.pipeline(transaction=False)
        ended: list[str] = []
        for job_id, event in items:
            self.append(pipe, job_id, event.model_dump_json(exclude_none=True))
            job = inflight.get(job_id)
            if job is not None and not job.first_token_seen and event.token is not None:
                job.first_token_seen = True
                pipe.hset(self.keys.job(job_id), RecordField.FIRST_TOKEN_AT, now)
            if event.final:
                self.finish(pipe, job_id, event.result, now, job.entry_id if job else None)
                ended.append(job_id)
        await pipe.execute()
        return ended

    def append(self, pipe: Pipeline, job_id: str, payload: str) -> None:
        pipe.xadd(self.keys.events(job_id), {"e": payload}, maxlen=self.maxlen, approximate=True)
        pipe.publish(self.keys.channel(job_id), payload)

    def finish(
        self, pipe: Pipeline, job_id: str, result: JobResult | None, now: float, entry_id: str | None
    ) -> None:
        """Final record, ack and TTLs, queued on `pipe`."""
        if result is not None:
            pipe.hset(
                self.keys.job(job_id),
                mapping={
                    RecordField.STATUS: result.status.value,
                    RecordField.RESULT: result.model_dump_json(exclude_none=True),
                    RecordField.FINISHED_AT: now,
                },
            )
        if entry_id is not None:
            pipe.xack(self.keys.jobs_stream, WORKER_GROUP, entry_id)
        for key in self.keys.job_keys(job_id):
            pipe.expire(key, self.result_ttl)
