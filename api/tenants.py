"""Per-tenant bookkeeping: the index of a tenant's recent jobs (listing) and its cap on jobs queued
or running at once (`max_concurrent_requests_per_tenant`).

Both are sorted sets scored by creation time, and neither needs the worker: members of the active
set whose record is terminal are pruned by the api when it admits a job; the index drops members
older than result_ttl + INDEX_SLACK_S at each submit (a listing skips ids whose record expired).
"""

from __future__ import annotations

import time

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from api.errors import ValidationError
from schemas.job import JobSpec, JobStatus, RecordField
from schemas.keys import Keys
from schemas.settings import Settings

# A tenant's index lives this long past its last submit beyond the result TTL, so a job that is
# queued or running for a long time still shows in the listing.
INDEX_SLACK_S = 86400
# A member of the active set without a record is pruned only when older than this: its record
# may still be being written.
WRITE_GRACE_S = 10.0


class TenantIndex:
    def __init__(self, redis: Redis, keys: Keys, settings: Settings) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings

    def add(self, pipe: Pipeline, spec: JobSpec) -> None:
        index = self.keys.tenant_jobs(spec.tenant)
        retention = self.settings.result_ttl + INDEX_SLACK_S
        pipe.zadd(index, {spec.id: spec.created_at})
        pipe.zremrangebyscore(index, "-inf", spec.created_at - retention)
        pipe.expire(index, retention)

    async def admit(self, spec: JobSpec) -> bool:
        """Counts the job against its tenant's cap; False (and not counted) if the cap is reached.
        Optimistic: add, count, take back if over, so two racing submits never both pass."""
        cap = self.settings.max_concurrent_requests_per_tenant
        if cap is None:
            return True
        active = self.keys.tenant_active(spec.tenant)
        await self._prune_active(active)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(active, {spec.id: spec.created_at})
        pipe.zcard(active)
        pipe.expire(active, self.settings.result_ttl + INDEX_SLACK_S)
        _, count, _ = await pipe.execute()
        if count > cap:
            await self.redis.zrem(active, spec.id)
            return False
        return True

    async def _prune_active(self, active: str) -> None:
        members = await self.redis.zrange(active, 0, -1, withscores=True)
        if not members:
            return
        pipe = self.redis.pipeline(transaction=False)
        for job_id, _ in members:
            pipe.hget(self.keys.job(job_id), RecordField.STATUS)
        statuses = await pipe.execute()
        now = time.time()
        done = [
            job_id
            for (job_id, created), status in zip(members, statuses, strict=True)
            if (status is None and now - created > WRITE_GRACE_S)
            or (status is not None and JobStatus(status).is_terminal)
        ]
        if done:
            await self.redis.zrem(active, *done)

    async def page(self, tenant: str, limit: int, after: str | None) -> tuple[list[str], bool]:
        """Job ids of the tenant, newest first, after the job `after`; and whether more follow."""
        index = self.keys.tenant_jobs(tenant)
        top: str = "+inf"
        if after is not None:
            score = await self.redis.zscore(index, after)
            if score is None:
                raise ValidationError(f"after: no job {after!r} in this tenant's list", param="after")
            top = f"({score!r}"
        ids: list[str] = await self.redis.zrevrangebyscore(index, top, "-inf", start=0, num=limit + 1)
        return ids[:limit], len(ids) > limit
