"""The web console (`/console`): static files from api/console/, and the one JSON view no other route
gives, `GET /v1/console/overview` — the queue, the workers and the fleet's recent jobs at a glance,
and each configured model's queue and live workers (docs/operations/multi-model.md).

The console is plain HTML, CSS and JS modules served from here (no build step, nothing from a CDN: the
Content-Security-Policy allows this origin only). It sends the API key the user types as the Bearer
header, like any client.

Throughput and error counts come from the job records: the newest jobs of every tenant's index (the
sorted sets `/v1/jobs` lists from), at most MAX_SAMPLED submitted in the last WINDOW_S + SLACK_S,
grouped by the minute they finished in. It is fleet-wide, needs no worker, and costs one small
script call per sampled job (the result's token count is read inside Redis, so no generated text
crosses the wire).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from pathlib import Path
from typing import cast

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from pydantic import BaseModel, Field

from conveyor.api.auth import Auth, is_admin, tenant
from conveyor.api.context import ApiContext
from conveyor.api.errors import NotFound
from conveyor.api.fleet import live_workers
from conveyor.api.openapi import error_responses
from conveyor.jobqueue.scripts.jobs import JOB_STATS
from conveyor.wire.heartbeat import WorkerInfo
from conveyor.wire.job import JobStatus

router = APIRouter(tags=["Console"])

STATIC = Path(__file__).parents[1] / "console"
FILES = {"index.html": "text/html", "console.css": "text/css", "api.js": "text/javascript",
         "views.js": "text/javascript", "playground.js": "text/javascript", "main.js": "text/javascript"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
WINDOW_S = 600  # the minutes the overview counts jobs over
SLACK_S = 300  # jobs submitted this long before the window may have finished in it
MAX_SAMPLED = 1000  # newest jobs read at most per overview
ENDED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED)


class Minute(BaseModel):
    start: float = Field(description="Epoch seconds the minute starts at.")
    ended: dict[str, int] = Field(description="Jobs that ended in this minute, by terminal status.")
    tokens: int = Field(description="Completion tokens of the jobs that ended in this minute.")


class JobCounts(BaseModel):
    window_s: int
    sampled: int = Field(description="Job records read (the newest of every tenant, submitted lately).")
    truncated: bool = Field(description="More jobs were submitted lately than were read.")
    by_status: dict[str, int] = Field(description="The sampled jobs by status now.")
    minutes: list[Minute] = Field(description="Oldest first, one per minute of the window.")


class Queue(BaseModel):
    queued: int = Field(description="Jobs no worker has read yet (every shard, band and own stream).")
    running: int = Field(description="Jobs read by a worker and not yet acknowledged.")


class ModelQueue(Queue):
    name: str = Field(description="A configured model's name, as requests give it in `model`.")
    aliases: list[str] = Field(description="Other names requests may give for it.")
    workers: int = Field(description="Live workers that run it (their heartbeats' `model`).")


class Overview(BaseModel):
    now: float
    tenant: str
    admin: bool = Field(description="The caller may use the operator pages (`admin_tenants`).")
    open: bool = Field(description="No API keys are configured: everyone is tenant `default`.")
    queue: Queue = Field(description="Every model's queue together (each as `GET /queue?model=NAME` "
                                     "counts it).")
    models: list[ModelQueue] = Field(description="Each configured model's queue and workers, the default "
                                                 "first.")
    workers: list[WorkerInfo] = Field(description="The live workers, by model then id.")
    jobs: JobCounts
    dead_letters: int | None = Field(default=None, description="Dead-letter entries (operators only).")


def _file(name: str) -> Response:
    media = FILES.get(name)
    if media is None:
        raise NotFound(f"no console file {name!r}: open /console")
    return FileResponse(STATIC / name, media_type=media, headers=HEADERS)


@router.get("/console", include_in_schema=False)
async def console() -> Response:
    return _file("index.html")


@router.get("/console/", include_in_schema=False)
async def console_slash() -> Response:
    return RedirectResponse("/console")


@router.get("/console/{name}", include_in_schema=False)
async def console_file(name: str) -> Response:
    return _file(name)


async def _candidates(ctx: ApiContext, since: float) -> tuple[list[str], bool]:
    """The newest job ids of every tenant submitted after `since`, at most MAX_SAMPLED."""
    redis, keys = ctx.jobs.redis, ctx.jobs.keys
    indexes = [key async for key in redis.scan_iter(match=keys.tenant_jobs_pattern, count=1000)]
    pipe = redis.pipeline(transaction=False)
    for index in indexes:
        pipe.zrevrangebyscore(index, "+inf", since, start=0, num=MAX_SAMPLED + 1, withscores=True)
    found = [pair for pairs in (await pipe.execute() if indexes else []) for pair in pairs]
    newest = heapq.nlargest(MAX_SAMPLED, found, key=lambda pair: pair[1])
    return [job_id for job_id, _ in newest], len(found) > len(newest)


async def job_counts(ctx: ApiContext, now: float) -> JobCounts:
    redis, keys = ctx.jobs.redis, ctx.jobs.keys
    ids, truncated = await _candidates(ctx, now - WINDOW_S - SLACK_S)
    # Loaded first, then EVALSHA as a command: redis-py's cluster pipeline refuses its evalsha method
    # (and the Script helper) but routes the command by its key; SCRIPT LOAD reaches every primary.
    sha = await redis.script_load(JOB_STATS.source) if ids else ""
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.execute_command("EVALSHA", sha, 1, keys.job(job_id))
    rows = await pipe.execute() if ids else []
    n = WINDOW_S // 60
    start = now - WINDOW_S
    minutes = [Minute(start=start + 60 * i, ended={s.value: 0 for s in ENDED}, tokens=0) for i in range(n)]
    by_status: dict[str, int] = {s.value: 0 for s in JobStatus}
    for status, finished_at, tokens in rows:
        if status is None:  # expired since it was listed
            continue
        by_status[status] = by_status.get(status, 0) + 1
        if finished_at is not None and float(finished_at) >= start:
            minute = minutes[min(n - 1, int((float(finished_at) - start) // 60))]
            minute.ended[status] = minute.ended.get(status, 0) + 1
            minute.tokens += int(tokens or 0)
    return JobCounts(window_s=WINDOW_S, sampled=sum(by_status.values()), truncated=truncated,
                     by_status=by_status, minutes=minutes)


@router.get("/v1/console/overview", response_model=Overview, responses=error_responses("openai", 401, 503))
async def overview(request: Request, caller: str = Depends(tenant)) -> Overview:
    """What the console's overview shows: each model's queue depth (as /metrics computes it), the live
    workers (their heartbeats), and the jobs of the last minutes (fleet-wide counts, no tenant's data)."""
    ctx = ApiContext.of(request)
    auth: Auth = request.app.state.auth
    admin = is_admin(auth, caller, ctx.settings)
    now = time.time()
    catalog = ctx.models.catalog
    answers = await asyncio.gather(  # in parallel; a gather of mixed calls types each answer as object
        live_workers(ctx), job_counts(ctx, now), *(ctx.jobs.queue_depth(q) for q in catalog.queues))
    workers, jobs = cast(list[WorkerInfo], answers[0]), cast(JobCounts, answers[1])
    depths = cast(list[tuple[int, int]], answers[2:])
    models = [ModelQueue(name=name, aliases=catalog.aliases_of(name), queued=queued, running=running,
                         workers=sum(w.model == name for w in workers))
              for name, (queued, running) in zip(catalog.names, depths, strict=True)]
    dead = await ctx.jobs.redis.xlen(ctx.jobs.keys.dead_letter_stream) if admin else None
    return Overview(now=now, tenant=caller, admin=admin, open=auth.open,
                    queue=Queue(queued=sum(m.queued for m in models), running=sum(m.running for m in models)),
                    models=models, workers=sorted(workers, key=lambda w: (w.model, w.id)), jobs=jobs,
                    dead_letters=dead)

