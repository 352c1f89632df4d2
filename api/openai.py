"""OpenAI dialect: /v1/chat/completions, /v1/completions, /v1/models — the same job path as TGI's."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from api.auth import tenant
from api.errors import NotFound
from api.openai_validation import chat_job, completion_job
from api.service import Service
from api.tgi import SSE_HEADERS, failure, sse, succeeded
from schemas.job import EventToken, JobEvent, JobResult, JobSpec, JobStatus
from schemas.openai import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionUsage,
    Model,
    ModelList,
    OpenAIErrorResponse,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
)

router = APIRouter(prefix="/v1", tags=["OpenAI"])

ERRORS: dict[int | str, dict] = {
    400: {"model": OpenAIErrorResponse, "description": "Malformed JSON"},
    401: {"model": OpenAIErrorResponse, "description": "Missing or invalid API key"},
    413: {"model": OpenAIErrorResponse, "description": "Request body larger than payload_limit"},
    422: {"model": OpenAIErrorResponse, "description": "Invalid parameter (`param` names it)"},
    429: {"model": OpenAIErrorResponse, "description": "Model is overloaded (see the Retry-After header)"},
    500: {"model": OpenAIErrorResponse, "description": "Generation error"},
}
FINGERPRINT = "conveyor"


def _stream_doc(schema: str) -> dict[int | str, dict]:
    return {**ERRORS, 200: {
        "description": f"JSON, or with `stream: true` Server-Sent Events: `data: <{schema}>` chunks, then "
        "`data: [DONE]`. A job that fails mid-way sends `data: {\"error\": {...}}` instead.",
        "content": {"text/event-stream": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }}


def finish_reason(result: JobResult) -> str:
    return "length" if result.finish_reason == "length" else "stop"


def usage(result: JobResult, spec: JobSpec) -> CompletionUsage:
    u = result.usage
    prompt, completion = (u.prompt_tokens, u.completion_tokens) if u else (len(spec.prompt_ids), 0)
    cached = u.cached_tokens if u else 0
    return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion,
                           total_tokens=prompt + completion,
                           prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


def _text(event: JobEvent) -> str:
    t = event.token
    return t.text if t is not None and not t.special else ""


def _top(t: EventToken) -> TopLogprob:
    return TopLogprob(token=t.text, logprob=t.logprob if t.logprob is not None else 0.0,
                      bytes=list(t.text.encode()))


def _chat_logprobs(events: list[JobEvent]) -> ChoiceLogprobs:
    return ChoiceLogprobs(content=[
        TokenLogprob(**_top(e.token).model_dump(), top_logprobs=[_top(t) for t in e.top_tokens])
        for e in events if e.token is not None and not e.token.special
    ])


def _completion_logprobs(events: list[JobEvent], offset: int) -> CompletionLogprobs:
    out = CompletionLogprobs(top_logprobs=[])
    for e in events:
        if e.token is None or e.token.special:
            continue
        out.tokens.append(e.token.text)
        out.token_logprobs.append(e.token.logprob)
        out.top_logprobs.append({t.text: t.logprob or 0.0 for t in e.top_tokens})  # type: ignore[union-attr]
        out.text_offset.append(offset)
        offset += len(e.token.text)
    return out


def _head(prefix: str, spec: JobSpec, service: Service) -> dict[str, Any]:
    return {"id": f"{prefix}-{spec.id}", "created": int(spec.created_at), "model": service.model_id,
            "system_fingerprint": FINGERPRINT}


ChunkModel = type[ChatCompletionChunk] | type[Completion]


async def _chunks(
    service: Service, spec: JobSpec, model: ChunkModel, head: dict[str, Any], include_usage: bool,
    choice: Callable[[JobEvent, JobResult | None], Any],
) -> AsyncIterator[str]:
    """A job's events as OpenAI chunks (`choice` renders one event), the usage chunk if asked for,
    then `[DONE]`. With include_usage every chunk carries `usage` (null but in the last)."""
    usage_null = {"usage": None} if include_usage else {}
    result: JobResult | None = None
    async for event in service.follow(spec.id):
        if event is None:
            yield ": keep-alive\n\n"
            continue
        if event.final:
            result = event.result
            if result is None or result.status is not JobStatus.SUCCEEDED:
                yield sse(json.dumps(failure(result).openai_body()))
                return
        chunk = model(**head, choices=[choice(event, result)])
        yield sse(json.dumps({**chunk.model_dump(mode="json", exclude={"usage"}), **usage_null}))
        if result is not None:
            break
    if include_usage and result is not None:
        yield sse(model(**head, choices=[], usage=usage(result, spec)).model_dump_json())
    yield "data: [DONE]\n\n"


@router.post("/chat/completions", response_model=ChatCompletion, responses=_stream_doc("ChatCompletionChunk"))
async def chat_completions(body: ChatCompletionRequest, request: Request, tenant: str = Depends(tenant)):  # type: ignore[no-untyped-def]
    """Chat completion; `stream: true` streams chunks. A client that disconnects cancels its job."""
    service: Service = request.app.state.service
    spec = chat_job(service.settings, service.tokenizer, service.chat_template, body, tenant)
    await service.jobs.submit(spec)
    common = _head("chatcmpl", spec, service)
    if body.stream:
        def choice(event: JobEvent, result: JobResult | None) -> ChunkChoice:
            return ChunkChoice(
                delta=ChunkDelta(content=_text(event)),
                logprobs=_chat_logprobs([event]) if body.logprobs else None,
                finish_reason=finish_reason(result) if result else None,  # type: ignore[arg-type]
            )

        chunks = _chunks(service, spec, ChatCompletionChunk, common, body.include_usage, choice)
        return StreamingResponse(chunks, media_type="text/event-stream",
                                 headers={**SSE_HEADERS, "X-Job-Id": spec.id})
    events = await service.collect(spec.id, request)
    result = succeeded(events[-1])
    completion = ChatCompletion(
        **common,
        choices=[ChatChoice(message=AssistantMessage(content=result.generated_text),
                            logprobs=_chat_logprobs(events) if body.logprobs else None,
                            finish_reason=finish_reason(result))],  # type: ignore[arg-type]
        usage=usage(result, spec),
    )
    return JSONResponse(completion.model_dump(mode="json"), headers={"X-Job-Id": spec.id})


@router.post("/completions", response_model=Completion, responses=_stream_doc("Completion"))
async def completions(body: CompletionRequest, request: Request, tenant: str = Depends(tenant)):  # type: ignore[no-untyped-def]
    """Text completion of a raw prompt (no chat template); `stream: true` streams chunks."""
    service: Service = request.app.state.service
    spec = completion_job(service.settings, service.tokenizer, body, tenant)
    await service.jobs.submit(spec)
    prompt_text = service.tokenizer.decode(spec.prompt_ids) if body.echo else ""
    common = _head("cmpl", spec, service)
    if body.stream:
        echo = [prompt_text]  # sent with the first chunk

        def choice(event: JobEvent, result: JobResult | None) -> CompletionChoice:
            text = (echo.pop() if echo else "") + _text(event)
            return CompletionChoice(
                text=text,
                logprobs=_completion_logprobs([event], 0) if body.logprobs is not None else None,
                finish_reason=finish_reason(result) if result else None,  # type: ignore[arg-type]
            )

        chunks = _chunks(service, spec, Completion, common, body.include_usage, choice)
        return StreamingResponse(chunks, media_type="text/event-stream",
                                 headers={**SSE_HEADERS, "X-Job-Id": spec.id})
    events = await service.collect(spec.id, request)
    result = succeeded(events[-1])
    completion = Completion(
        **common,
        choices=[CompletionChoice(
            text=prompt_text + result.generated_text,
            logprobs=_completion_logprobs(events, len(prompt_text)) if body.logprobs is not None else None,
            finish_reason=finish_reason(result))],  # type: ignore[arg-type]
        usage=usage(result, spec),
    )
    return JSONResponse(completion.model_dump(mode="json"), headers={"X-Job-Id": spec.id})


def _model(service: Service) -> Model:
    return Model(id=service.model_id, created=int(time.time()),
                 max_model_len=service.settings.max_total_tokens)


@router.get("/models", response_model=ModelList, responses={401: ERRORS[401]})
async def models(request: Request, _tenant: str = Depends(tenant)) -> ModelList:
    """The model this service runs."""
    return ModelList(data=[_model(request.app.state.service)])


@router.get("/models/{model_id:path}", response_model=Model, responses={401: ERRORS[401], 404: {
    "model": OpenAIErrorResponse, "description": "No such model"}})
async def model(model_id: str, request: Request, _tenant: str = Depends(tenant)) -> Model:
    """One model, by id."""
    service: Service = request.app.state.service
    if model_id != service.model_id:
        raise NotFound(f"model {model_id!r} is not served here; this service runs {service.model_id!r}",
                       param="model")
    return _model(service)
