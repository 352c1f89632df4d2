"""Admission: the caps on jobs queued or running at once, `max_concurrent_requests` over the whole
service, `max_concurrent_requests_per_tenant` and `max_concurrent_requests_per_model` (each model
its own set, so one model's burst cannot take every place), held exactly under bursts and across api
processes.

Each cap is a sorted set of the jobs it admitted, scored by creation time; one script on that one
key counts and adds atomically (one key per script, so the layout runs on Redis Cluster). Nothing
removes a job when it ends: when a set is full, the api prunes the members whose record is
terminal (or missing past WRITE_GRACE_S) and tries once more, so neither cap needs the worker, and
a slot leaked by a request that died half-way is reclaimed by the same prune.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import suppress

from redis.asyncio import Redis
from redis.exceptions import RedisError

from conveyor.api.errors import Overloaded
from conveyor.api.jobpath.tenants import INDEX_SLACK_S
from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.scripts.jobs import ADMIT
from conveyor.settings import Settings
from conveyor.wire.job import JobSpec, JobStatus, RecordField

# A job's keys may still be being written this long after it was created: a member of an admitted
# set (or an Idempotency-Key's job) without a record counts as gone only past it.
WRITE_GRACE_S = 10.0
OVERLOADED = "Model is overloaded"  # TGI's words: clients match on them


async def prune_ended(redis: Redis, keys: Keys, key: str) -> int:
    """Removes from the sorted set `key` the jobs that have ended or whose record is gone."""
    members: list[tuple[str, float]] = await redis.zrange(key, 0, -1, withscores=True)  # type: ignore[assignment]
    if not members:
        return 0
    pipe = redis.pipeline(transaction=False)
    for job_id, _ in members:
        pipe.hget(keys.job(job_id), RecordField.STATUS)
    statuses = await pipe.execute()
    now = time.time()
    done = [
        job_id
        for (job_id, created), status in zip(members, statuses, strict=True)
        if (status is None and now - created > WRITE_GRACE_S)
        or (status is not None and JobStatus(status).is_terminal)
    ]
    if done:
        await redis.zrem(key, *done)
    return len(done)


class Admission:
    def __init__(self, redis: Redis, keys: Keys, settings: Settings) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings
        self._admit = redis.register_script(ADMIT.source)
        self._pruning: dict[str, asyncio.Future[int]] = {}  # one prune of a set at a time per process

    def _caps(self, spec: JobSpec) -> list[tuple[str, int, str]]:
        """(key, cap, the refusal's message) of each cap the job counts against."""
        caps = [(self.keys.admitted, self.settings.max_concurrent_requests, OVERLOADED)]
        per_tenant = self.settings.max_concurrent_requests_per_tenant
        if per_tenant is not None:
            caps.append((self.keys.tenant_active(spec.tenant), per_tenant, OVERLOADED))
        per_model = self.settings.max_concurrent_requests_per_model
        if per_model is not None:
            # The default model's jobs carry no `model`; its served name, where the settings give it.
            name = spec.model or self.settings.served_model_name or "the default model"
            caps.append((self.keys.model_active(spec.model), per_model,
                         f"{OVERLOADED}: model {name!r} has {per_model} jobs queued or running "
                         "(max_concurrent_requests_per_model); retry later or use another model"))
        return caps

    async def admit(self, spec: JobSpec) -> None:
        """Counts the job against every cap, or raises Overloaded and counts it against none."""
        taken: list[str] = []
        for key, cap, message in self._caps(spec):
            try:
                admitted = await self._take(key, cap, spec)
            except BaseException:
                await self._give_back(spec.id, taken)
                raise
            if not admitted:
                await self._give_back(spec.id, taken)
                raise Overloaded(retry_after=1, message=message)
            taken.append(key)

    async def release(self, spec: JobSpec) -> None:
        """Takes back the job's admission (its write failed): best effort, a prune reclaims it anyway."""
        await self._give_back(spec.id, [key for key, _, _ in self._caps(spec)])

    async def _take(self, key: str, cap: int, spec: JobSpec) -> bool:
        args: list[str | float] = [spec.id, spec.created_at, cap, self.settings.result_ttl + INDEX_SLACK_S]
        if await self._admit(keys=[key], args=args):
            return True
        await self._prune(key)
        return bool(await self._admit(keys=[key], args=args))

    async def _prune(self, key: str) -> None:
        """Requests refused at once share one prune: a burst over the cap costs one pass, not one each."""
        running = self._pruning.get(key)
        if running is None:
            running = asyncio.ensure_future(prune_ended(self.redis, self.keys, key))
            self._pruning[key] = running

            def done(future: asyncio.Future[int]) -> None:
                if self._pruning.get(key) is future:
                    del self._pruning[key]
                if not future.cancelled():
                    future.exception()  # retrieved: the waiters got it

            running.add_done_callback(done)
        await asyncio.shield(running)

    async def _give_back(self, job_id: str, keys: list[str]) -> None:
        if not keys:
            return
        with suppress(RedisError, OSError):
            pipe = self.redis.pipeline(transaction=False)
            for key in keys:
                pipe.zrem(key, job_id)
            await pipe.execute()
