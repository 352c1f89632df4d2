"""The index of a tenant's recent jobs, for listing (`GET /v1/jobs`).

A sorted set scored by creation time that needs no worker: it drops members older than
result_ttl + INDEX_SLACK_S at each submit, and a listing skips ids whose record expired. (The
tenant's cap on jobs queued or running at once is admission's: conveyor/api/jobpath/admission.py.)
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from conveyor.api.paging import newest_first
from conveyor.jobqueue.keys import Keys
from conveyor.settings import Settings
from conveyor.wire.job import JobSpec

# A tenant's index lives this long past its last submit beyond the result TTL, so a job that is
# queued or running for a long time still shows in the listing.
INDEX_SLACK_S = 86400


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

    async def page(self, tenant: str, limit: int, after: str | None) -> tuple[list[str], bool]:
        """Job ids of the tenant, newest first, after the job `after`; and whether more follow."""
        return await newest_first(self.redis, self.keys.tenant_jobs(tenant), limit, after,
                                  unknown_after="job")
