"""The api's side of the job path: admit and write a job (record + stream entry), cancel it, read it."""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from conveyor.api.errors import Overloaded, Unavailable, ValidationError
from conveyor.api.jobpath.admission import WRITE_GRACE_S, Admission
from conveyor.api.jobpath.placement import Placement
from conveyor.api.jobpath.tenants import TenantIndex
from conveyor.api.metrics import ApiMetrics
from conveyor.jobqueue.client import cluster_of
from conveyor.jobqueue.depth import QueuePlace, read_depth
from conveyor.jobqueue.keys import OLD_API, Keys, event_entry_id
from conveyor.jobqueue.pubsub.publish import publish_to_followers
from conveyor.jobqueue.queue import ensure_group
from conveyor.jobqueue.replicated import ReplicasBehind, execute_replicated
from conveyor.jobqueue.scripts.jobs import END_QUEUED, RECLAIM, UNCLAIM
from conveyor.settings import Settings
from conveyor.telemetry.tracing import Tracing
from conveyor.webhooks.enqueue import WebhookQueue
from conveyor.wire.event_batch import dump_events
from conveyor.wire.job import JobEvent, JobResult, JobSpec, JobStatus, RecordField

log = logging.getLogger("conveyor.api.jobpath.store")

CLAIM_TRIES = 3
# On a cluster a job's record is written before its queue entry (another slot), with this TTL until
# the entry is written too: a submit that fails in between leaves nothing that outlives it.
PROVISIONAL_TTL_S = 600


def new_job_id() -> str:
    return uuid.uuid4().hex


def spec_payload(spec: JobSpec) -> str:
    """The spec as the record and the queue entry keep it: fields at their defaults left out (the
    model puts them back when read), a third of a short job's record (benchmarks/job_memory.py)."""
    return spec.model_dump_json(exclude_defaults=True)


class Unconfirmed(Unavailable):
    """503: the job is written on the primary, but not on `submit_replicas` replicas in time."""


@dataclass(frozen=True, slots=True)
class Submitted:
    job_id: str
    replayed: bool = False  # an earlier submit with the same Idempotency-Key


class JobStore:
    def __init__(self, redis: Redis, keys: Keys, settings: Settings, metrics: ApiMetrics | None = None,
                 webhooks: WebhookQueue | None = None, tracing: Tracing | None = None,
                 follower: str = OLD_API) -> None:
        self.redis = redis
        self.follower = follower  # this api process's id (Relay.api_id): the `watched` its followed jobs get
        self.keys = keys
        self.settings = settings
        self.metrics = metrics
        self.webhooks = webhooks  # for the jobs the api itself ends (in the queue)
        self.tracing = tracing
        self.tenants = TenantIndex(redis, keys, settings)
        self.admission = Admission(redis, keys, settings)
        self.placement = Placement(redis, keys, settings)  # the default model's
        self._placements: dict[str | None, Placement] = {None: self.placement}  # per model's queue
        if settings.submit_replicas and cluster_of(redis):
            raise ValueError("submit_replicas needs one primary with replicas: on Redis Cluster a job's "
                             "writes span nodes, which one WAIT cannot confirm; unset it (or set 0)")
        self._end_queued = redis.register_script(END_QUEUED.source)
        self._reclaim = redis.register_script(RECLAIM.source)
        self._unclaim = redis.register_script(UNCLAIM.source)

    async def ensure_group(self, queues: tuple[str | None, ...] = (None,)) -> None:
        """The workers' consumer group on each model's queue (None: the default model's), so the
        queue's lag is measured, and a model's jobs wait for its workers, before any starts."""
        for queue in queues:
            await ensure_group(self.redis, self.keys.for_model(queue))

    def placement_for(self, queue: str | None) -> Placement:
        """Prefix-affinity placement on a model's queue: only its own workers' caches count."""
        placement = self._placements.get(queue)
        if placement is None:
            placement = self._placements[queue] = Placement(self.redis, self.keys.for_model(queue),
                                                            self.settings)
        return placement

    async def queue_depth(self, queue: str | None = None) -> tuple[int, int]:
        """(queued, running) summed over every place of a model's queue (None: the default model's;
        conveyor/jobqueue/depth.py)."""
        places = await self.queue_places(queue)
        return sum(p.queued for p in places), sum(p.running for p in places)

    async def queue_places(self, queue: str | None = None) -> list[QueuePlace]:
        """The jobs of each place of a model's queue: shards × (bands, workers' own streams)."""
        return await read_depth(self.redis, self.keys.for_model(queue))

    def enqueue(self, pipe: Pipeline, spec: JobSpec, payload: str) -> None:
        """Queues the job's entry on its stream: the own stream of the worker holding its prompt's
        prefix (conveyor/api/jobpath/placement.py), else the shared one of its shard (its id's) and band
        (its priority's), of its model's queue (`spec.model`)."""
        fields: dict[Any, Any] = {"id": spec.id, "spec": payload}  # redis-py's stubs: not dict[str, str]
        if self.placement_for(spec.model).enqueue(pipe, spec, fields) is None:
            keys = self.keys.for_model(spec.model)
            pipe.xadd(keys.stream_of(spec.id, spec.priority, self.settings.priority_bands), fields)

    async def submit(self, spec: JobSpec, idempotency_key: str | None = None,
                     fingerprint: str = "", followed: bool = True) -> Submitted:
        """Admits and writes the job; with an Idempotency-Key seen before, answers that job instead.
        `followed`: this request follows the job's events (sync and streaming requests), so its record
        is `watched` from the start and its worker publishes its tokens live from the first on; async
        jobs and Batch lines are not, until a relay follows them (Relay.batches)."""
        idem = self.keys.idempotency(spec.tenant, idempotency_key) if idempotency_key else None
        claim = f"{spec.id} {spec.created_at} {fingerprint}"
        if idem is not None:
            earlier = await self._claim(idem, claim, fingerprint)
            if earlier is not None:
                return Submitted(earlier, replayed=True)
        try:
            await self.admission.admit(spec)
            if self.tracing is not None:
                self.tracing.tag(**{"conveyor.job_id": spec.id, "conveyor.tenant": spec.tenant})
                spec = spec.model_copy(update={"traceparent": self.tracing.traceparent()})
            try:
                await self._write(spec, followed)
            except (RedisError, OSError):
                await self.admission.release(spec)
                raise
        except Unconfirmed:  # the job is queued and may run: it keeps its place and its key
            raise
        except BaseException:  # refused or failed: no job, so the key answers no job either
            if idem is not None:
                with suppress(RedisError, OSError):  # else it is free again WRITE_GRACE_S from now
                    await self._unclaim(keys=[idem], args=[claim])
            raise
        log.info("job %s submitted (%s, %d prompt tokens)", spec.id, spec.kind, len(spec.prompt_ids),
                 extra={"job_id": spec.id, "tenant": spec.tenant})
        return Submitted(spec.id)

    async def _write(self, spec: JobSpec, followed: bool) -> None:
        pipe = self.job_pipeline()
        payload = spec_payload(spec)
        record: dict[str, str | int] = {
            RecordField.STATUS: JobStatus.QUEUED.value,
            RecordField.SPEC: payload,
            RecordField.TENANT: spec.tenant,
        }
        if followed:
            record[RecordField.WATCHED] = self.follower
        pipe.hset(self.keys.job(spec.id), mapping=record)  # type: ignore[arg-type]
        self.tenants.add(pipe, spec)
        await self.enqueue_after(pipe, spec, payload)

    def job_pipeline(self) -> Pipeline:
        """The pipeline for a job's record writes, which `enqueue_after` completes: a transaction on
        one node (all or nothing), a plain pipeline on a cluster (its keys span slots)."""
        return self.redis.pipeline(transaction=not cluster_of(self.redis))

    async def enqueue_after(self, pipe: Pipeline, spec: JobSpec, payload: str) -> None:
        """Runs `pipe` (the job's record writes, from `job_pipeline`) and then the job's stream entry,
        so that a submit either creates a job that will run or leaves nothing behind, and a worker
        never reads an entry without its record.

        One node: the entry joins the same MULTI, and Redis applies all of it or, refused at queue
        time (OOM at maxmemory) or cut off, none. A cluster: the record lives in another slot than
        the entry, and a pipeline split by node keeps no order across nodes. So the record is written
        first with a provisional TTL, then the entry, then the TTL lifted (a worker's TAKE lifts it
        too). A failure before the entry deletes the record, or, if Redis cannot even do that, leaves
        it to expire; the tenant index skips ids without a record, admission frees their places.
        With `submit_replicas`, the one node's transaction returns once that many replicas have it
        (Unconfirmed past the timeout: the job is written all the same)."""
        if not cluster_of(self.redis):
            self.enqueue(pipe, spec, payload)
            if self.settings.submit_replicas:
                try:
                    await execute_replicated(self.redis, pipe, self.settings.submit_replicas,
                                             self.settings.submit_replicas_timeout_ms)
                except ReplicasBehind as behind:
                    raise Unconfirmed(f"job {spec.id} is queued, but {behind} (submit_replicas): it may "
                                      "still run; retry with the same Idempotency-Key to get this job, "
                                      "not a second one") from behind
            else:
                await pipe.execute()
            return
        record = self.keys.job(spec.id)
        pipe.expire(record, PROVISIONAL_TTL_S)
        await pipe.execute()
        try:
            entry = self.redis.pipeline(transaction=False)
            self.enqueue(entry, spec, payload)
            await entry.execute()
        except (RedisError, OSError):
            with suppress(RedisError, OSError):
                await self.redis.delete(record)
            raise
        await self.redis.persist(record)

    async def _claim(self, idem: str, claim: str, fingerprint: str) -> str | None:
        """Claims the Idempotency-Key for this job (None), or answers the earlier job that holds it.
        Every step is one atomic command, so two racing submits never both claim it."""
        ttl = self.settings.idempotency_ttl
        for _ in range(CLAIM_TRIES):
            if await self.redis.set(idem, claim, nx=True, ex=ttl):
                return None
            value: str | None = await self.redis.get(idem)  # type: ignore[assignment]  # decoded replies
            if value is None:  # expired just now: claim it again
                continue
            earlier = await self._replay(value, fingerprint)
            if earlier is not None:
                return earlier
            if await self._reclaim(keys=[idem], args=[value, claim, ttl]):
                return None
        raise Overloaded(retry_after=1)  # other submits with this key keep winning the race: retry

    async def _replay(self, value: str, fingerprint: str) -> str | None:
        """The earlier job of a claim, or None if that job's keys expired (the key is free again)."""
        job_id, created_at, earlier_fingerprint = value.split(" ", 2)
        if earlier_fingerprint != fingerprint:
            raise ValidationError(
                "Idempotency-Key was already used with a different request body: use a new key",
                param="Idempotency-Key",
            )
        if time.time() - float(created_at) > WRITE_GRACE_S and not await self.redis.exists(
            self.keys.job(job_id)
        ):
            return None  # that job's keys expired: this is a new job
        return job_id  # (a job claimed moments ago may still be being written)

    async def cancel(self, job_id: str) -> None:
        """Flag first (a queued job is dropped when read), tell the owning worker, and end the job
        at once if it is still queued."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.job(job_id), RecordField.CANCEL, time.time())
        # (PUBLISH as a command: redis-py's cluster pipeline refuses the method; on a cluster the
        # control channel is classic pub/sub, broadcast to every node, where every worker hears it)
        pipe.execute_command("PUBLISH", self.keys.control_channel, job_id)
        await pipe.execute()
        await self.end_queued(job_id, JobStatus.CANCELLED)

    async def end_queued(self, job_id: str, status: JobStatus) -> bool:
        """Ends a job that no worker has started (cancelled or expired); False if it had started.
        Its followers get the final event live (one that misses it reads it from the event stream
        at its next keep-alive: Relay.batches)."""
        result = JobResult.final(status)
        event = dump_events([JobEvent.ending(0, result)])
        watched = await self._end_queued(
            keys=[self.keys.job(job_id), self.keys.events(job_id)],
            args=[status.value, result.model_dump_json(exclude_none=True), time.time(), event,
                  self.settings.result_ttl, self.settings.event_stream_maxlen, event_entry_id(0),
                  self.settings.events_ttl],
        )
        if watched is None:
            return False
        if followers := watched.split():
            pipe = self.redis.pipeline(transaction=False)
            publish_to_followers(pipe, self.keys, {follower: {job_id: event} for follower in followers})
            await pipe.execute()
        await self._ended_in_queue(job_id, status)
        return True

    async def _ended_in_queue(self, job_id: str, status: JobStatus) -> None:
        """No worker will see this job run: its metrics and `completed` webhook are the api's."""
        if self.metrics is not None:
            self.metrics.ended_in_queue(status)
        if self.webhooks is None:
            return
        raw = await self.redis.hget(self.keys.job(job_id), RecordField.SPEC)
        spec = JobSpec.model_validate_json(raw) if raw else None
        log.info("job %s %s in the queue", job_id, status.value,
                 extra={"job_id": job_id, "tenant": spec.tenant if spec else None})
        if spec is not None and spec.webhook is not None and "completed" in spec.webhook.events:
            if self.metrics is not None:
                self.metrics.webhooks.labels("completed").inc()
            self.webhooks.notify(spec, "completed")

    async def record(self, job_id: str) -> dict[str, str]:
        return await self.redis.hgetall(self.keys.job(job_id))  # type: ignore[return-value]  # decoded
