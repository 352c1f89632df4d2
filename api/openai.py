"""OpenAI dialect: /v1/chat/completions, /v1/completions, /v1/models — the same job path as TGI's."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from api.auth import tenant
from api.body_text import unicode_body
from api.context import ApiContext
from api.errors import ApiError, NotFound
from api.openai_validation import chat_job, completion_job
from api.openapi import BODY_ERRORS, error_responses, event_stream
from api.sse import DONE, KEEP_ALIVE, failure, sse, stream, succeeded
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
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
)

router = APIRouter(prefix="/v1", tags=["OpenAI"], dependencies=[Depends(unicode_body)])

ERRORS = error_responses("openai", *BODY_ERRORS)
FINGERPRINT = "conveyor"


def _stream_doc(schema: str) -> dict[int | str, dict]:
    return {**ERRORS, 200: event_stream(schema, f"JSON, or with `stream: true` Server-Sent Events: "
                                        f"`data: <{schema}>` chunks, then `data: [DONE]`. A job that fails "
                                        "mid-way sends `data: {\"error\": {...}}` instead.", "openai",
                                        done=True)}


def error_event(error: ApiError) -> str:
    """OpenAI's error event: `data: {"error": {...}}`, and no `[DONE]` after it."""
    return sse(json.dumps(error.openai_body()))


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


def _head(prefix: str, spec: JobSpec, ctx: ApiContext) -> dict[str, Any]:
    return {"id": f"{prefix}-{spec.id}", "created": int(spec.created_at), "model": ctx.model_id,
            "system_fingerprint": FINGERPRINT}


ChunkModel = type[ChatCompletionChunk] | type[Completion]


async def _chunks(
    ctx: ApiContext, spec: JobSpec, model: ChunkModel, head: dict[str, Any], include_usage: bool,
    choice: Callable[[JobEvent, JobResult | None], Any],
) -> AsyncIterator[str]:
    """A job's events as OpenAI chunks (`choice` renders one event), the usage chunk if asked for,
    then `[DONE]`. With include_usage every chunk carries `usage` (null but in the last)."""
    usage_null = {"usage": None} if include_usage else {}
    result: JobResult | None = None
    async for event in ctx.follow(spec.id):
        if event is None:
            yield KEEP_ALIVE
            continue
        if event.final:
            result = event.result
            if result is None or result.status is not JobStatus.SUCCEEDED:
                yield error_event(failure(result))
                return
        chunk = model(**head, choices=[choice(event, result)])
        yield sse(json.dumps({**chunk.model_dump(mode="json", exclude={"usage"}), **usage_null}))
        if result is not None:
            break
    if include_usage and result is not None:
        yield sse(model(**head, choices=[], usage=usage(result, spec)).model_dump_json())
    yield DONE


@router.post("/chat/completions", response_model=ChatCompletion, responses=_stream_doc("ChatCompletionChunk"))
async def chat_completions(body: ChatCompletionRequest, request: Request, tenant: str = Depends(tenant)):  # type: ignore[no-untyped-def]
    """Chat completion; `stream: true` streams chunks. A client that disconnects cancels its job."""
    ctx = ApiContext.of(request)
    spec = chat_job(ctx.settings, ctx.tokenizer, ctx.chat_template, body, tenant)
    await ctx.jobs.submit(spec)
    common = _head("chatcmpl", spec, ctx)
    if body.stream:
        def choice(event: JobEvent, result: JobResult | None) -> ChunkChoice:
            return ChunkChoice(
                delta=ChunkDelta(content=_text(event)),
                logprobs=_chat_logprobs([event]) if body.logprobs else None,
                finish_reason=finish_reason(result) if result else None,  # type: ignore[arg-type]
            )

        chunks = _chunks(ctx, spec, ChatCompletionChunk, common, body.include_usage, choice)
        return stream(chunks, error_event, spec.id)
    events = await ctx.collect(spec.id, request)
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
    ctx = ApiContext.of(request)
    spec = completion_job(ctx.settings, ctx.tokenizer, body, tenant)
    await ctx.jobs.submit(spec)
    prompt_text = ctx.tokenizer.decode(spec.prompt_ids) if body.echo else ""
    common = _head("cmpl", spec, ctx)
    if body.stream:
        echo = [prompt_text]  # sent with the first chunk

        def choice(event: JobEvent, result: JobResult | None) -> CompletionChoice:
            text = (echo.pop() if echo else "") + _text(event)
            return CompletionChoice(
                text=text,
                logprobs=_completion_logprobs([event], 0) if body.logprobs is not None else None,
                finish_reason=finish_reason(result) if result else None,  # type: ignore[arg-type]
            )

        chunks = _chunks(ctx, spec, Completion, common, body.include_usage, choice)
        return stream(chunks, error_event, spec.id)
    events = await ctx.collect(spec.id, request)
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


def _model(ctx: ApiContext) -> Model:
    return Model(id=ctx.model_id, created=int(time.time()), max_model_len=ctx.settings.max_total_tokens)


@router.get("/models", response_model=ModelList, responses=error_responses("openai", 401))
async def models(request: Request, _tenant: str = Depends(tenant)) -> ModelList:
    """The model this service runs."""
    return ModelList(data=[_model(ApiContext.of(request))])


@router.get("/models/{model_id:path}", response_model=Model,
            responses=error_responses("openai", 401, 404, notes={404: "No such model"}))
async def model(model_id: str, request: Request, _tenant: str = Depends(tenant)) -> Model:
    """One model, by id."""
    ctx = ApiContext.of(request)
    if model_id != ctx.model_id:
        raise NotFound(f"model {model_id!r} is not served here; this service runs {ctx.model_id!r}",
                       param="model")
    return _model(ctx)
