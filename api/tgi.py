"""TGI dialect: /generate, /generate_stream, POST / — one job path, two ways to wait on it."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from api.auth import tenant
from api.errors import GenerationError
from api.service import Service
from api.validation import tgi_job
from schemas.job import EventToken, JobEvent, JobResult, JobSpec, JobStatus
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
    401: {"model": ErrorResponse, "description": "Missing or invalid API key"},
    413: {"model": ErrorResponse, "description": "Request body larger than payload_limit"},
    422: {"model": ErrorResponse, "description": "Input validation error"},
    429: {"model": ErrorResponse, "description": "Model is overloaded (see the Retry-After header)"},
    500: {"model": ErrorResponse, "description": "Generation error"},
}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _token(t: EventToken) -> Token:
    return Token(id=t.id, text=t.text, logprob=t.logprob, special=t.special)


def failure(result: JobResult | None) -> GenerationError:
    if result is None:
        return GenerationError("the job ended without a result")
    if result.status is JobStatus.CANCELLED:
        return GenerationError("the job was cancelled")
    if result.status is JobStatus.EXPIRED:
        return GenerationError("the job's deadline passed before it started")
    return GenerationError(result.error or f"the job ended {result.status.value}")


def succeeded(event: JobEvent) -> JobResult:
    """The final event's result, or the error that ended the job."""
    if event.result is None or event.result.status is not JobStatus.SUCCEEDED:
        raise failure(event.result)
    return event.result


def _full_text(inputs: str, text: str, return_full_text: bool | None) -> str:
    return inputs + text if return_full_text else text


async def submit(service: Service, body: GenerateRequest, tenant: str) -> JobSpec:
    spec = tgi_job(service.settings, service.tokenizer, service.chat_template, body.inputs, body.parameters,
                   tenant)
    await service.jobs.submit(spec)
    return spec


async def _generate(body: GenerateRequest, request: Request, tenant: str) -> tuple[GenerateResponse, str]:
    service: Service = request.app.state.service
    spec = await submit(service, body, tenant)
    events = await service.collect(spec.id, request)
    result = succeeded(events[-1])
    tokens = [_token(e.token) for e in events if e.token is not None]
    details = None
    if body.parameters.details:
        details = Details(
            finish_reason=result.finish_reason,  # type: ignore[arg-type]
            generated_tokens=result.usage.completion_tokens if result.usage else len(tokens),
            seed=result.seed,
            tokens=tokens,
            top_tokens=[[_token(t) for t in e.top_tokens] for e in events if e.token is not None]
            if spec.sampling.top_n_tokens else [],
        )
    text = _full_text(body.inputs, result.generated_text, body.parameters.return_full_text)
    return GenerateResponse(generated_text=text, details=details), spec.id


@router.post("/generate", response_model=GenerateResponse, responses=ERRORS)
async def generate(body: GenerateRequest, request: Request, tenant: str = Depends(tenant)) -> JSONResponse:
    """Generate tokens; answers when the job is done. A client that disconnects cancels its job."""
    response, job_id = await _generate(body, request, tenant)
    return JSONResponse(response.model_dump(mode="json"), headers={"X-Job-Id": job_id})


def sse(data: str, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}data: {data}\n\n"


def _error(result: JobResult | None) -> str:
    return sse(ErrorResponse(error=failure(result).message, error_type="generation").model_dump_json())


async def _stream(service: Service, spec: JobSpec, body: GenerateRequest) -> AsyncIterator[str]:
    async for event in service.follow(spec.id):
        if event is None:
            yield ": keep-alive\n\n"
            continue
        result = event.result
        if event.token is None:  # a job that ended without a token of its own
            yield _error(result)
            return
        response = StreamResponse(index=event.index, token=_token(event.token),
                                  top_tokens=[_token(t) for t in event.top_tokens])
        if event.final and result is not None:
            if result.status is not JobStatus.SUCCEEDED:
                yield _error(result)
                return
            response.generated_text = _full_text(body.inputs, result.generated_text,
                                                 body.parameters.return_full_text)
            response.details = StreamDetails(
                finish_reason=result.finish_reason,  # type: ignore[arg-type]
                generated_tokens=result.usage.completion_tokens if result.usage else event.index + 1,
                seed=result.seed,
                input_length=len(spec.prompt_ids),
            )
        yield sse(response.model_dump_json(), event.index)


STREAM_RESPONSES: dict[int | str, dict] = {
    **ERRORS,
    200: {
        "description": "Server-Sent Events: one `StreamResponse` per token; the last one carries "
        "`generated_text` and `details`; a job that fails mid-way ends with an `ErrorResponse`.",
        "content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/StreamResponse"}}},
    },
}


@router.post("/generate_stream", response_class=StreamingResponse, responses=STREAM_RESPONSES)
async def generate_stream(body: GenerateRequest, request: Request,
                          tenant: str = Depends(tenant)) -> StreamingResponse:
    """Generate tokens, streamed as Server-Sent Events in TGI's shape. A client that disconnects
    cancels its job."""
    service: Service = request.app.state.service
    spec = await submit(service, body, tenant)
    return StreamingResponse(_stream(service, spec, body), media_type="text/event-stream",
                             headers={**SSE_HEADERS, "X-Job-Id": spec.id})


@router.post(
    "/",
    response_model=list[GenerateResponse],
    responses={
        **ERRORS,
        200: {"description": "A one-element list (as TGI), or Server-Sent Events when `stream` is true.",
              "content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/StreamResponse"}}}},
    },
)
async def compat_generate(body: CompatGenerateRequest, request: Request,
                          tenant: str = Depends(tenant)):  # type: ignore[no-untyped-def]
    """TGI's compatibility route: `/generate` answering a one-element list, or `/generate_stream`
    when `stream` is true. As in TGI, `return_full_text` defaults to true here."""
    if body.parameters.return_full_text is None:
        body.parameters.return_full_text = True
    if body.stream:
        return await generate_stream(body, request, tenant)
    response, job_id = await _generate(body, request, tenant)
    return JSONResponse([response.model_dump(mode="json")], headers={"X-Job-Id": job_id})
