"""A batch line's result as a line of the output or error file, in OpenAI's shape
`{id, custom_id, response: {status_code, request_id, body}, error}`: `body` is what
/v1/chat/completions or /v1/completions would have answered (the dialect's own builders)."""

from __future__ import annotations

from conveyor.api.batch.lines import Request, request_of
from conveyor.api.context import ApiContext
from conveyor.api.errors import ApiError, GenerationError
from conveyor.api.responses.sse import failure, succeeded
from conveyor.api.routes.openai import chat_answer, completion_answer
from conveyor.wire.batch import BatchLine, LineError, LineErrorBody, LineResponse, OutputLine
from conveyor.wire.event_batch import events_after
from conveyor.wire.job import JobEvent, JobResult, JobSpec, JobStatus
from conveyor.wire.openai import ChatCompletionRequest


def error_line(job_id: str, error: LineError) -> OutputLine:
    """An error file line for a line that never ran: the endpoint's answer if it refused the body."""
    if error.status_code is not None and error.body is not None:
        return OutputLine(id=f"batch_req_{job_id}", custom_id=error.custom_id,
                          response=LineResponse(status_code=error.status_code, body=error.body))
    return OutputLine(id=f"batch_req_{job_id}", custom_id=error.custom_id,
                      error=LineErrorBody(code=error.code, message=error.message))


def unrun_line(job_id: str, line: BatchLine | LineError, stopping: str) -> OutputLine:
    """An error file line for a line the batch's cancel or expiry kept from running."""
    why = "was cancelled" if stopping == "cancelled" else "expired (its completion_window passed)"
    return OutputLine(id=f"batch_req_{job_id}", custom_id=line.custom_id, error=LineErrorBody(
        code=f"batch_{stopping}", message=f"this request was not run: the batch {why}"))


async def line_events(ctx: ApiContext, job_id: str, request: Request, result: JobResult | None,
                      final_index: str | None) -> list[JobEvent]:
    """The finished job's events: its event stream, or once that expired (`replay_window`), the final
    event its record keeps, which answers every line that asked for no logprobs."""
    entries: list[tuple[str, dict[str, str]]] = await ctx.jobs.redis.xrange(  # type: ignore[assignment]
        ctx.jobs.keys.events(job_id))
    events = sorted(events_after(entries, -1), key=lambda e: e.index)
    if events and events[-1].final:
        return events
    if result is None or final_index is None:
        raise failure(result)
    wants_logprobs = (request.logprobs if isinstance(request, ChatCompletionRequest)
                      else request.logprobs is not None)
    if wants_logprobs:
        raise GenerationError(f"job {job_id} ended more than replay_window ago: its per-token events, "
                              "and with them the logprobs this line asked for, have expired")
    return [JobEvent.ending(int(final_index), result)]


async def result_line(ctx: ApiContext, line: BatchLine | LineError, job_id: str, spec_raw: str | None,
                      result_raw: str | None, final_raw: str | None) -> tuple[OutputLine, str]:
    """The finished job's line and its outcome: completed, failed, cancelled or expired."""
    result = JobResult.model_validate_json(result_raw) if result_raw else None
    status = result.status if result is not None else JobStatus.FAILED
    if status in (JobStatus.CANCELLED, JobStatus.EXPIRED):
        return unrun_line(job_id, line, status.value), status.value
    try:
        if not isinstance(line, BatchLine) or spec_raw is None:
            raise failure(result)
        request = request_of(line)
        events = await line_events(ctx, job_id, request, result, final_raw)
        succeeded(events[-1])
        spec = JobSpec.model_validate_json(spec_raw)
        answer = (chat_answer(ctx, spec, request, events) if isinstance(request, ChatCompletionRequest)
                  else completion_answer(ctx, spec, request, events))
    except (ApiError, ValueError) as exc:  # the job failed (or its events are gone): the endpoint's 500
        error = exc if isinstance(exc, ApiError) else failure(result)
        return OutputLine(id=f"batch_req_{job_id}", custom_id=line.custom_id, response=LineResponse(
            status_code=500, request_id=job_id, body=error.openai_body())), "failed"
    return OutputLine(id=f"batch_req_{job_id}", custom_id=line.custom_id, response=LineResponse(
        status_code=200, request_id=job_id, body=answer.model_dump(mode="json"))), "completed"
