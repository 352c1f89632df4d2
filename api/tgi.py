"""TGI dialect: /generate, /generate_stream, POST / — one job path, two ways to wait on it."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from api.errors import GenerationError
from api.service import Service
from api.validation import tgi_job
from schemas.job import JobEvent, JobResult, JobSpec, JobStatus
from schemas.tgi import (
    CompatGenerateRequest,
    Details,
    ErrorResponse,
    GenerateRequest,
    GenerateResponse,
    StreamDetails,
    StreamResponse,
    Token,
)

router = APIRouter(tags=["Text Generation Inference"])

ERRORS: dict[int | str, dict] = {
    400: {"model": ErrorResponse, "description": "Malformed JSON"},
    422: {"model": ErrorResponse, "description": "Input validation error"},
    429: {"model": ErrorResponse, "description": "Model is overloaded"},
    500: {"model": ErrorResponse, "description": "Generation error"},
}


def _token(event: JobEvent) -> Token:
    t = event.token
    if t is None:
        raise ValueError("event without a token")
    return Token(id=t.id, text=t.text, logprob=t.logprob, special=t.special)


def _failure(result: JobResult | None) -> GenerationError:
    if result is None:
        return GenerationError("the job ended without a result")
    if result.status is JobStatus.CANCELLED:
        return GenerationError("the job was cancelled")
    if result.status is JobStatus.EXPIRED:
        return GenerationError("the job's deadline passed before it started")
    return GenerationError(result.error or f"the job ended {result.status.value}")


def _full_text(inputs: str, text: str, return_full_text: bool | None) -> str:
    return inputs + text if return_full_text else text


@router.post("/generate", response_model=GenerateResponse, responses=ERRORS)
async def generate(body: GenerateRequest, request: Request) -> GenerateResponse:
    """Generate tokens; answers when the job is done."""
    service: Service = request.app.state.service
    spec = tgi_job(service.settings, service.tokenizer, service.chat_template, body.inputs, body.parameters)
    await service.jobs.submit(spec)
    tokens: list[Token] = []
    top_tokens: list[list[Token]] = []
    async for event in service.follow(spec.id, request):
        if event.token is not None:
            tokens.append(_token(event))
            top_tokens.append([Token(**t.model_dump()) for t in event.top_tokens])
        if event.final:
            result = event.result
            if result is None or result.status is not JobStatus.SUCCEEDED:
                raise _failure(result)
            details = None
            if body.parameters.details:
                details = Details(
                    finish_reason=result.finish_reason,  # type: ignore[arg-type]
                    generated_tokens=result.usage.completion_tokens if result.usage else len(tokens),
                    seed=result.seed,
                    tokens=tokens,
                    top_tokens=top_tokens if spec.sampling.top_n_tokens else [],
                )
            text = _full_text(body.inputs, result.generated_text, body.parameters.return_full_text)
            return GenerateResponse(generated_text=text, details=details)
    raise GenerationError("the event stream ended before the job did")


def _sse(event: StreamResponse | ErrorResponse, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}data: {event.model_dump_json()}\n\n"


async def _stream(service: Service, spec: JobSpec, inputs: str, body: GenerateRequest,
                  request: Request) -> AsyncIterator[str]:
    async for event in service.follow(spec.id, request, keepalive=True):
        if event is None:
            yield ": keep-alive\n\n"
            continue
        result = event.result
        if event.token is None:  # a job that ended without a token of its own
            error = _failure(result)
            yield _sse(ErrorResponse(error=error.message, error_type="generation"))
            return
        response = StreamResponse(
            index=event.index,
            token=_token(event),
            top_tokens=[Token(**t.model_dump()) for t in event.top_tokens],
        )
        if event.final and result is not None:
            if result.status is not JobStatus.SUCCEEDED:
                yield _sse(ErrorResponse(error=_failure(result).message, error_type="generation"))
                return
            response.generated_text = _full_text(
                inputs, result.generated_text, body.parameters.return_full_text
            )
            response.details = StreamDetails(
                finish_reason=result.finish_reason,  # type: ignore[arg-type]
                generated_tokens=result.usage.completion_tokens if result.usage else event.index + 1,
                seed=result.seed,
                input_length=len(spec.prompt_ids),
            )
        yield _sse(response, event.index)


@router.post(
    "/generate_stream",
    responses={**ERRORS, 200: {"content": {"text/event-stream": {}}, "description": "Token events"}},
)
async def generate_stream(body: GenerateRequest, request: Request) -> StreamingResponse:
    """Generate tokens, streamed as Server-Sent Events in TGI's shape."""
    service: Service = request.app.state.service
    spec = tgi_job(service.settings, service.tokenizer, service.chat_template, body.inputs, body.parameters)
    await service.jobs.submit(spec)
    return StreamingResponse(
        _stream(service, spec, body.inputs, body, request),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/",
    response_model=GenerateResponse,
    responses={**ERRORS, 200: {"content": {"text/event-stream": {}, "application/json": {}}}},
)
async def compat_generate(body: CompatGenerateRequest, request: Request):  # type: ignore[no-untyped-def]
    """TGI's compatibility route: `/generate`, or `/generate_stream` when `stream` is true."""
    if body.stream:
        return await generate_stream(body, request)
    return await generate(body, request)

