"""Server-Sent Events for every dialect (TGI, OpenAI, /v1/jobs): the framing, the keep-alive comment,
the headers, and what a job's final event means (its result, or the error that ended it).

Each dialect renders its own payloads; how they go on the wire is decided here once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from conveyor.api.errors import REDIS_FAULTS, ApiError, GenerationError, Unavailable, unavailable
from conveyor.api.jobpath.relay import StreamInterrupted
from conveyor.wire.job import JobEvent, JobResult, JobStatus

log = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"
KEEP_ALIVE = ": keep-alive\n\n"  # a comment line: clients ignore it, proxies see traffic
DONE = "data: [DONE]\n\n"  # OpenAI's end of stream
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering
_ENDS_A_STREAM: tuple[type[BaseException], ...] = (ApiError, *REDIS_FAULTS)  # with an error event


def sse(data: str, event_id: int | None = None, event: str | None = None) -> str:
    """One event: `id:` (what a client sends back as Last-Event-ID), `event:` (its type), `data:`."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    if event is not None:
        head += f"event: {event}\n"
    return f"{head}data: {data}\n\n"


def failure(result: JobResult | None) -> GenerationError:
    """The error a job that did not succeed answers with."""
    if result is None:
        return GenerationError("the job ended without a result")
    if result.status is JobStatus.CANCELLED:
        return GenerationError("the job was cancelled")
    if result.status is JobStatus.EXPIRED:
        return GenerationError("the job's deadline passed before it started")
    return GenerationError(result.error or f"the job ended {result.status.value}")


def succeeded(event: JobEvent) -> JobResult:
    """The final event's result, or (raised) the error that ended the job."""
    if event.result is None or event.result.status is not JobStatus.SUCCEEDED:
        raise failure(event.result)
    return event.result


def _mid_stream(exc: BaseException) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, StreamInterrupted):  # the relay's words are for the client: what to do next
        return Unavailable(str(exc))
    return unavailable(exc)


async def guarded(chunks: AsyncIterator[str], error_event: Callable[[ApiError], str]) -> AsyncIterator[str]:
    """The stream, ended by an error event in the dialect's shape when an error comes once the
    headers are sent (a status can no longer say it): Redis failing, the relay unable to go on
    without a gap, or a refusal the stream found (e.g. a Last-Event-ID past the end). Each chunk is
    one write: a dialect renders a batch of the relay's events (what one wake-up found) as one."""
    try:
        async for chunk in chunks:
            yield chunk
    except _ENDS_A_STREAM as exc:
        log.warning("a stream ended early (%s: %s)", type(exc).__name__, exc)
        yield error_event(_mid_stream(exc))


def stream(chunks: AsyncIterator[str], error_event: Callable[[ApiError], str],
           job_id: str | None = None) -> StreamingResponse:
    """The streaming answer: SSE headers, and `X-Job-Id` for a stream tied to its own job."""
    headers = {**HEADERS, **({"X-Job-Id": job_id} if job_id is not None else {})}
    return StreamingResponse(guarded(chunks, error_event), media_type=MEDIA_TYPE, headers=headers)
