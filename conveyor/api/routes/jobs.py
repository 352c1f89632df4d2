"""Async jobs (`/v1/jobs`): submit and get 202, poll, follow the events (resumable), cancel, list.

An async job is not tied to any connection: pollers and event readers come and go freely.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from conveyor.api.auth import tenant
from conveyor.api.body_text import unicode_body
from conveyor.api.context import ApiContext
from conveyor.api.errors import ApiError, NotFound, ValidationError
from conveyor.api.openapi import error_responses, event_stream
from conveyor.api.requests.limits import tgi_job
from conveyor.api.requests.openai import chat_job, completion_job
from conveyor.api.requests.webhook import check_webhook
from conveyor.api.responses.sse import KEEP_ALIVE, sse, stream
from conveyor.wire.job import JobSpec, JobStatus, RecordField
from conveyor.wire.jobs_api import (
    ChatJob,
    CompletionJob,
    GenerateJob,
    JobAccepted,
    JobList,
    JobRequest,
    JobUrls,
    JobView,
)

router = APIRouter(prefix="/v1/jobs", tags=["Async jobs"], dependencies=[Depends(unicode_body)])

NOTES = {404: "No such job for this tenant"}
CANCEL_WAIT_S = 2.0  # DELETE waits this long for a running job to reach its terminal state


def urls(job_id: str) -> JobUrls:
    return JobUrls.of(job_id)


def _spec(ctx: ApiContext, body: GenerateJob | ChatJob | CompletionJob, tenant: str) -> JobSpec:
    s = ctx
    if isinstance(body, ChatJob):
        served = ctx.models.route(body.model)
        spec = chat_job(s.settings, served.tokenizer, served.chat_template, body, tenant)
    elif isinstance(body, CompletionJob):
        served = ctx.models.route(body.model)
        spec = completion_job(s.settings, served.tokenizer, body, tenant)
    else:  # TGI's body names no model: the default one
        served = ctx.models.default
        spec = tgi_job(s.settings, s.tokenizer, s.chat_template, body.inputs, body.parameters, tenant)
    spec.model = served.queue
    deadline = body.deadline_epoch(spec.created_at)
    if deadline is not None and deadline <= spec.created_at:
        raise ValidationError(f"`deadline` must be in the future (given {deadline:.0f}, now "
                              f"{spec.created_at:.0f})", param="deadline")
    return spec.model_copy(update={"priority": body.priority, "deadline": deadline, "webhook": body.webhook})


def _check_idempotency_key(key: str | None) -> None:
    # RFC 9110 header field values are ASCII; the Idempotency-Key draft allows printable ASCII only.
    if key is not None and not (0 < len(key) <= 255 and key.isascii() and key.isprintable()
                                and " " not in key):
        raise ValidationError("`Idempotency-Key` must be 1-255 printable ASCII characters without spaces",
                              param="Idempotency-Key")


@router.post("", status_code=202, response_model=JobAccepted, responses={
    **error_responses("openai", 400, 401, 404, 413, 422, 429, 500, 503, notes={
        500: "Internal error", 404: "`model` names no model of this service (code model_not_found)"}),
    202: {"description": "Accepted (or, with a known Idempotency-Key, the earlier job: header "
                         "Idempotent-Replayed: true)"}})
async def submit(
    body: Annotated[JobRequest, Body(description="A TGI generate, OpenAI chat or completion body, with "
                                                 "optional webhook, priority, deadline or ttl.")],
    request: Request,
    tenant: str = Depends(tenant),
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JSONResponse:
    """Submit a job; answers 202 at once with its id and URLs."""
    ctx = ApiContext.of(request)
    _check_idempotency_key(idempotency_key)
    spec = _spec(ctx, body, tenant)
    if spec.webhook is not None:
        await check_webhook(spec.webhook, tenant, ctx.webhook_secrets, ctx.webhook_allow,
                            enabled=ctx.jobs.webhooks is not None)
    fingerprint = hashlib.sha256(body.model_dump_json().encode()).hexdigest()[:32]
    submitted = await ctx.jobs.submit(spec, idempotency_key, fingerprint, followed=False)
    status = JobStatus.QUEUED
    if submitted.replayed:
        record = await ctx.jobs.record(submitted.job_id)
        status = JobStatus(record.get(RecordField.STATUS, JobStatus.QUEUED.value))
    accepted = JobAccepted(id=submitted.job_id, status=status, urls=urls(submitted.job_id))
    headers = {"Location": accepted.urls.self}
    if submitted.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(accepted.model_dump(mode="json"), status_code=202, headers=headers)


async def _record(ctx: ApiContext, job_id: str, tenant: str) -> dict[str, str]:
    """The job's record; 404 when it does not exist or belongs to another tenant."""
    record = await ctx.jobs.record(job_id)
    if not record or record.get(RecordField.TENANT) != tenant:
        raise NotFound(f"no job {job_id!r}", param="id")
    return record


def view(job_id: str, record: dict[str, str]) -> JobView:
    return JobView.from_record(job_id, record)


async def _current(ctx: ApiContext, job_id: str, record: dict[str, str]) -> dict[str, str]:
    """A queued job past its deadline is expired now rather than when a worker reads it."""
    if record.get(RecordField.STATUS) == JobStatus.QUEUED.value:
        deadline = JobSpec.model_validate_json(record[RecordField.SPEC]).deadline
        if deadline is not None and deadline < time.time():
            await ctx.jobs.end_queued(job_id, JobStatus.EXPIRED)
            return await ctx.jobs.record(job_id)
    return record


@router.get("/{job_id}", response_model=JobView,
            responses=error_responses("openai", 401, 404, 503, notes=NOTES))
async def get_job(job_id: str, request: Request, tenant: str = Depends(tenant)) -> JobView:
    """The job's status, timestamps (epoch seconds), and result once it has ended."""
    ctx = ApiContext.of(request)
    record = await _current(ctx, job_id, await _record(ctx, job_id, tenant))
    return view(job_id, record)


async def _events(ctx: ApiContext, job_id: str, after: int) -> AsyncIterator[str]:
    async for batch in ctx.relay.batches(job_id, after):
        if batch is None:
            yield KEEP_ALIVE
        else:
            yield "".join(sse(event.model_dump_json(exclude_none=True), event.index) for event in batch)


def error_event(error: ApiError) -> str:
    """Not a JobEvent: `event: error` with OpenAI's error object and no `id`, so that a client that
    reconnects with Last-Event-ID resumes after the last event it did get."""
    return sse(json.dumps(error.openai_body()), event="error")


EVENTS_DOC = ("Server-Sent Events: `id: <index>` and `data: <JobEvent>`, ending with the event that has "
              "`final: true` (and the result). If the stream cannot go on (Redis failed), it ends with "
              "`event: error` and `data: {\"error\": {...}}`: reconnect with Last-Event-ID.")


@router.get("/{job_id}/events", response_class=StreamingResponse, responses={
    200: event_stream("JobEvent", EVENTS_DOC, "openai"),
    **error_responses("openai", 401, 404, 422, 503, notes=NOTES)})
async def job_events(
    job_id: str, request: Request, tenant: str = Depends(tenant),
    last_event_id: Annotated[int | None, Header(alias="Last-Event-ID", ge=-1)] = None,
) -> StreamingResponse:
    """The job's events as SSE, from the start or after `Last-Event-ID`; works while the job runs and
    after it has ended. Disconnecting does not cancel the job."""
    ctx = ApiContext.of(request)
    await _current(ctx, job_id, await _record(ctx, job_id, tenant))
    after = -1 if last_event_id is None else last_event_id
    await ctx.relay.check_resume(job_id, after)  # 422 past the end of a running job, before the 200
    return stream(_events(ctx, job_id, after), error_event)


@router.delete("/{job_id}", response_model=JobView, responses={
    200: {"description": "The job's state after the cancel: `cancelled`, or the terminal state it had "
          "reached already"},
    202: {"model": JobView, "description": "Cancel requested; the job had not ended yet"},
    **error_responses("openai", 401, 404, 503, notes=NOTES)})
async def cancel_job(job_id: str, request: Request, tenant: str = Depends(tenant)) -> JSONResponse:
    """Cancel the job. A job that has ended keeps (and answers) its terminal state."""
    ctx = ApiContext.of(request)
    record = await _current(ctx, job_id, await _record(ctx, job_id, tenant))
    if not JobStatus(record[RecordField.STATUS]).is_terminal:
        await ctx.jobs.cancel(job_id)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while True:
            record = await ctx.jobs.record(job_id)
            if JobStatus(record[RecordField.STATUS]).is_terminal or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
    job = view(job_id, record)
    return JSONResponse(job.model_dump(mode="json"), status_code=200 if job.status.is_terminal else 202)


@router.get("", response_model=JobList, responses=error_responses("openai", 401, 422, 503))
async def list_jobs(
    request: Request, tenant: str = Depends(tenant),
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(description="The last id of the previous page")] = None,
) -> JobList:
    """The caller's recent jobs, newest first, `limit` at a time."""
    ctx = ApiContext.of(request)
    ids, has_more = await ctx.jobs.tenants.page(tenant, limit, after)
    records = await asyncio.gather(*(ctx.jobs.record(i) for i in ids))
    data = [view(i, r) for i, r in zip(ids, records, strict=True) if r]  # skips expired jobs
    return JobList(data=data, first_id=data[0].id if data else None, last_id=ids[-1] if ids else None,
                   has_more=has_more)
