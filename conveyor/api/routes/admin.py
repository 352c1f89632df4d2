"""Operator endpoints (`/v1/admin`): the dead-letter stream — list its entries with their reason,
requeue one, delete one. Only tenants in `admin_tenants` may call them (everyone on an open api).

A dead-letter entry is the jobs-stream entry a worker gave up on (conveyor/worker/publisher.py `dead_letter`:
the entry's `id` and `spec`, plus `entry_id`, `deliveries`, `reason`, `worker`, `at`). Requeueing
makes the job new again so a worker runs it afresh: its record is rewritten as `queued` (no result,
owner, attempts or seed), its event stream — which ends with the failure's final event, and which a
worker would otherwise resume from or take as finished — is deleted, and a new jobs-stream entry is
added, whose delivery count starts again at 1: a whole `max_attempts` budget. The request (prompt,
sampling, priority, webhook) is kept; the deadline is dropped unless `ttl` gives a new one.
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request
from pydantic import BaseModel, Field, ValidationError

from conveyor.api.auth import admin_tenant
from conveyor.api.context import ApiContext
from conveyor.api.errors import Conflict, NotFound
from conveyor.api.errors import ValidationError as InvalidRequest
from conveyor.api.jobpath.store import spec_payload
from conveyor.api.openapi import error_responses
from conveyor.wire.job import JobSpec, JobStatus, RecordField
from conveyor.wire.jobs_api import MAX_TTL_S, JobAccepted, JobUrls

router = APIRouter(prefix="/v1/admin", tags=["Admin"])

ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
ENTRY_404 = {404: "No such dead-letter entry"}


class DeadLetter(BaseModel):
    id: str = Field(description="The entry's id in the dead-letter stream (what requeue and delete take).")
    job_id: str | None = None
    tenant: str | None = None
    kind: str | None = None
    prompt_tokens: int | None = None
    max_new_tokens: int | None = None
    reason: str = ""
    deliveries: int | None = Field(default=None, description="Deliveries of the job when it was given up on.")
    worker: str | None = Field(default=None, description="The worker that gave up on it.")
    at: float | None = Field(default=None, description="When it was dead-lettered (epoch seconds).")
    entry_id: str | None = Field(default=None, description="Its entry id in the jobs stream back then.")
    stream: str | None = Field(default=None, description="That jobs stream (shard × priority band).")
    job_status: str | None = Field(default=None, description="The job record's status now; none: expired.")
    requeueable: bool = Field(description="The entry holds a job spec this api can read.")


class DeadLetterList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DeadLetter]
    total: int = Field(description="Entries in the dead-letter stream.")
    last_id: str | None = None
    has_more: bool = False


class RequeueRequest(BaseModel):
    ttl: float | None = Field(default=None, gt=0, le=MAX_TTL_S,
                              description="Seconds from now: the requeued job's deadline (none: none).")


class Deleted(BaseModel):
    id: str
    object: Literal["dead_letter"] = "dead_letter"
    deleted: bool = True


def _entry_id(value: str) -> str:
    if not ENTRY_ID.match(value):
        raise InvalidRequest(f"entry_id: {value!r} is not a stream entry id (`<ms>-<seq>`, e.g. "
                             "`1733050000000-0`): take `id` from GET /v1/admin/dead-letters",
                             param="entry_id")
    return value


EntryId = Annotated[str, Path(description="The entry's id in the dead-letter stream")]


def _spec(fields: dict[str, str]) -> JobSpec | None:
    try:
        return JobSpec.model_validate_json(fields.get("spec", ""))
    except ValidationError:
        return None


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _view(entry_id: str, fields: dict[str, str], status: str | None) -> DeadLetter:
    spec = _spec(fields)
    deliveries = _number(fields.get("deliveries"))
    return DeadLetter(
        id=entry_id, job_id=fields.get("id") or (spec.id if spec else None),
        tenant=spec.tenant if spec else None, kind=spec.kind if spec else None,
        prompt_tokens=len(spec.prompt_ids) if spec else None,
        max_new_tokens=spec.stopping.max_new_tokens if spec else None,
        reason=fields.get("reason", ""), deliveries=int(deliveries) if deliveries is not None else None,
        worker=fields.get("worker"), at=_number(fields.get("at")), entry_id=fields.get("entry_id"),
        stream=fields.get("stream"), job_status=status, requeueable=spec is not None,
    )


@router.get("/dead-letters", response_model=DeadLetterList,
            responses=error_responses("openai", 401, 403, 422, 503))
async def list_dead_letters(
    request: Request, _admin: str = Depends(admin_tenant),
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    before: Annotated[str | None, Query(description="The last id of the previous page")] = None,
) -> DeadLetterList:
    """The dead-letter stream's entries, newest first, with the reason each job was given up on."""
    ctx = ApiContext.of(request)
    redis, keys = ctx.jobs.redis, ctx.jobs.keys
    top = "+" if before is None else "(" + _entry_id(before)
    entries: list[tuple[str, dict[str, str]]] = await redis.xrevrange(  # type: ignore[assignment]
        keys.dead_letter_stream, top, "-", count=limit + 1)
    total = await redis.xlen(keys.dead_letter_stream)
    page = entries[:limit]
    pipe = redis.pipeline(transaction=False)
    for _id, fields in page:
        pipe.hget(keys.job(fields.get("id", "")), RecordField.STATUS)
    statuses = await pipe.execute() if page else []
    data = [_view(i, f, s) for (i, f), s in zip(page, statuses, strict=True)]
    return DeadLetterList(data=data, total=total, last_id=data[-1].id if data else None,
                          has_more=len(entries) > limit)


async def _entry(ctx: ApiContext, entry_id: str) -> dict[str, str]:
    entries: list[Any] = await ctx.jobs.redis.xrange(  # type: ignore[assignment]  # decoded replies
        ctx.jobs.keys.dead_letter_stream, entry_id, entry_id)
    if not entries:
        raise NotFound(f"no dead-letter entry {entry_id!r} (deleted or requeued already?)", param="entry_id")
    fields: dict[str, str] = entries[0][1]
    return fields


@router.post("/dead-letters/{entry_id}/requeue", status_code=202, response_model=JobAccepted, responses={
    202: {"description": "Requeued: the job is queued again, with a whole max_attempts budget"},
    **error_responses("openai", 400, 401, 403, 404, 409, 413, 422, 429, 503, notes=ENTRY_404)})
async def requeue_dead_letter(
    entry_id: EntryId, request: Request, _admin: str = Depends(admin_tenant),
    body: Annotated[RequeueRequest | None, Body()] = None,
) -> JobAccepted:
    """Queue the entry's job again, to run from the start, and remove the entry. The job keeps its id,
    tenant and request; its old result and events are dropped."""
    ctx = ApiContext.of(request)
    redis, keys = ctx.jobs.redis, ctx.jobs.keys
    fields = await _entry(ctx, _entry_id(entry_id))
    spec = _spec(fields)
    if spec is None:
        raise InvalidRequest(f"dead-letter entry {entry_id} holds no job spec this api can read (written by "
                             "another version?): it cannot be requeued; delete it and resubmit the job",
                             param="entry_id")
    status: str | None = await redis.hget(keys.job(spec.id), RecordField.STATUS)  # type: ignore[assignment]
    if status is not None and not JobStatus(status).is_terminal:
        raise Conflict(f"job {spec.id} is {status} already (requeued before?): wait for it to end, or "
                       "cancel it first", param="entry_id")
    now = time.time()
    ttl = body.ttl if body is not None else None
    spec = spec.model_copy(update={"created_at": now, "deadline": now + ttl if ttl is not None else None})
    await ctx.jobs.admission.admit(spec)  # the caps hold for requeued jobs too (429 when full)
    payload = spec_payload(spec)
    pipe = ctx.jobs.job_pipeline()
    pipe.delete(keys.job(spec.id), keys.events(spec.id))
    pipe.hset(keys.job(spec.id), mapping={
        RecordField.STATUS: JobStatus.QUEUED.value, RecordField.SPEC: payload,
        RecordField.TENANT: spec.tenant,
    })
    ctx.jobs.tenants.add(pipe, spec)
    pipe.xdel(keys.dead_letter_stream, entry_id)
    await ctx.jobs.enqueue_after(pipe, spec, payload)  # all or nothing, the record before the entry
    return JobAccepted(id=spec.id, status=JobStatus.QUEUED, urls=JobUrls.of(spec.id))


@router.delete("/dead-letters/{entry_id}", response_model=Deleted,
               responses=error_responses("openai", 401, 403, 404, 422, 503, notes=ENTRY_404))
async def delete_dead_letter(entry_id: EntryId, request: Request,
                             _admin: str = Depends(admin_tenant)) -> Deleted:
    """Remove the entry from the dead-letter stream (the job's record, if it still lives, is kept)."""
    ctx = ApiContext.of(request)
    if not await ctx.jobs.redis.xdel(ctx.jobs.keys.dead_letter_stream, _entry_id(entry_id)):
        raise NotFound(f"no dead-letter entry {entry_id!r} (deleted or requeued already?)", param="entry_id")
    return Deleted(id=entry_id)
