"""The api's side of the job path: write a job (record + stream entry), cancel it, read it."""

from __future__ import annotations

import time
import uuid

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from api.errors import Overloaded
from schemas.job import JobSpec, JobStatus, RecordField
from schemas.keys import WORKER_GROUP, Keys


def new_job_id() -> str:
    return uuid.uuid4().hex


class JobStore:
    def __init__(self, redis: Redis, keys: Keys, max_concurrent_requests: int, result_ttl: int) -> None:
        self.redis = redis
        self.keys = keys
        self.max_concurrent_requests = max_concurrent_requests
        self.result_ttl = result_ttl

    async def outstanding(self) -> int | None:
        """Jobs queued (not yet read by a worker) plus running (read, not acknowledged)."""
        try:
            groups = await self.redis.xinfo_groups(self.keys.jobs_stream)
        except ResponseError:  # no stream yet: nothing outstanding
            return 0
        for group in groups:
            if group["name"] == WORKER_GROUP:
                lag = group.get("lag")
                if lag is None:  # Redis < 7 does not report it
                    return None
                return int(group["pending"]) + int(lag)
        return 0

    async def submit(self, spec: JobSpec) -> None:
        outstanding = await self.outstanding()
        if outstanding is not None and outstanding >= self.max_concurrent_requests:
            raise Overloaded(retry_after=1)
        # Record first, then the stream entry: a worker never reads a job without its record. Not a
        # MULTI: the two keys live in different slots on Redis Cluster.
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(
            self.keys.job(spec.id),
            mapping={
                RecordField.STATUS: JobStatus.QUEUED.value,
                RecordField.SPEC: spec.model_dump_json(),
                RecordField.TENANT: spec.tenant,
                RecordField.CREATED_AT: spec.created_at,
            },
        )
        pipe.xadd(self.keys.jobs_stream, {"id": spec.id, "spec": spec.model_dump_json()})
        await pipe.execute()

    async def cancel(self, job_id: str) -> None:
        """Flag first (a queued job is dropped when read), then tell the owning worker."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.job(job_id), RecordField.CANCEL, time.time())
        pipe.publish(self.keys.control_channel, job_id)
        await pipe.execute()

    async def record(self, job_id: str) -> dict[str, str]:
        return await self.redis.hgetall(self.keys.job(job_id))
