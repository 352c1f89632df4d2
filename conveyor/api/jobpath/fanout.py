"""One request, several jobs (a completion with several prompts): submit them all or none, wait on
them all, or follow their events interleaved as they come. Every job is admitted on its own, so
the admission caps count each one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from fastapi import Request

from conveyor.api.context import ApiContext
from conveyor.wire.job import JobEvent, JobSpec

_END = object()  # a job's event stream ended


async def submit_all(ctx: ApiContext, specs: list[JobSpec]) -> None:
    """Submits each job; if one is refused (429, 503, ...) the ones already queued are cancelled, so
    a refused request leaves no job running."""
    done: list[JobSpec] = []
    try:
        for spec in specs:
            await ctx.jobs.submit(spec)
            done.append(spec)
    except BaseException:
        for spec in done:
            ctx.cancel_soon(spec.id)
        raise


async def collect_all(ctx: ApiContext, specs: list[JobSpec], request: Request) -> list[list[JobEvent]]:
    """Every job's events, in the jobs' order. If one fails to be collected (its client went away,
    Redis failed), the others are cancelled too."""
    tasks = [asyncio.create_task(ctx.collect(spec.id, request)) for spec in specs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()  # a no-op for those done; cancelling one cancels its job (follow())


async def _pump(ctx: ApiContext, i: int, job_id: str, queue: asyncio.Queue[tuple[int, object]]) -> None:
    try:
        async for batch in ctx.follow(job_id):
            await queue.put((i, batch))
    except Exception as exc:  # handed to the consumer, which raises it in the stream
        await queue.put((i, exc))
    finally:
        await queue.put((i, _END))


Indexed = tuple[int, list[JobEvent] | None]


async def follow_all(ctx: ApiContext, specs: list[JobSpec]) -> AsyncGenerator[Indexed, None]:
    """(job index, a batch of its events) as the jobs' events arrive (ApiContext.follow), None
    batches being keep-alive pauses; ends when every job's stream has ended. Closing it early
    cancels the jobs still running."""
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
    tasks = [asyncio.create_task(_pump(ctx, i, spec.id, queue)) for i, spec in enumerate(specs)]
    try:
        open_streams = len(tasks)
        while open_streams:
            i, item = await queue.get()
            if item is _END:
                open_streams -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
