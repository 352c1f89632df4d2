"""OpenAI dialect: /v1/chat/completions, /v1/completions, /v1/models — the same job path as TGI's."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from conveyor.api.auth import tenant
from conveyor.api.body_text import unicode_body
from conveyor.api.context import ApiContext
from conveyor.api.errors import ApiError
from conveyor.api.fleet import live_workers
from conveyor.api.jobpath.fanout import collect_all, follow_all, submit_all
from conveyor.api.models import ModelNotFound
from conveyor.api.openapi import BODY_ERRORS, error_responses, event_stream
from conveyor.api.requests import tools as tool_calls
from conveyor.api.requests.choices import best, events_of
from conveyor.api.requests.openai import chat_job, check_stream_options, completion_jobs
from conveyor.api.responses.openai import (
    ChunkWriter,
    chat_choice,
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    summed_usage,
    text_of,
    usage,
)
from conveyor.api.responses.prompt_details import prompt_of
from conveyor.api.responses.sse import DONE, KEEP_ALIVE, failure, sse, stream, succeeded
from conveyor.api.responses.tool_stream import ToolStream
from conveyor.wire.job import ChoiceResult, JobEvent, JobResult, JobSpec, JobStatus
from conveyor.wire.openai import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    ChunkDelta,
    Completion,
    CompletionChoice,
    CompletionRequest,
    CompletionUsage,
    Model,
    ModelList,
)

router = APIRouter(prefix="/v1", tags=["OpenAI"], dependencies=[Depends(unicode_body)])

ERRORS = error_responses("openai", *BODY_ERRORS, 404,
                         notes={404: "`model` names no model of this service (code model_not_found)"})
FINGERPRINT = "conveyor"


def _stream_doc(schema: str) -> dict[int | str, dict]:
    return {**ERRORS, 200: event_stream(schema, f"JSON, or with `stream: true` Server-Sent Events: "
                                        f"`data: <{schema}>` chunks, then `data: [DONE]`. A job that fails "
                                        "mid-way sends `data: {\"error\": {...}}` instead.", "openai",
                                        done=True)}


def error_event(error: ApiError) -> str:
    """OpenAI's error event: `data: {"error": {...}}`, and no `[DONE]` after it."""
    return sse(json.dumps(error.openai_body()))


def _head(prefix: str, spec: JobSpec, ctx: ApiContext) -> dict[str, Any]:
    # spec.model: the queue of the model that ran it, which is that model's name (None: the default)
    return {"id": f"{prefix}-{spec.id}", "created": int(spec.created_at), "model": spec.model or ctx.model_id,
            "system_fingerprint": FINGERPRINT}


ChunkModel = type[ChatCompletionChunk] | type[Completion]
OpenAIBody = ChatCompletionRequest | CompletionRequest
Ending = JobResult | ChoiceResult  # how the choice of a chunk ended: its job's result, or its own


async def _one(ctx: ApiContext, spec: JobSpec) -> AsyncGenerator[tuple[int, list[JobEvent] | None], None]:
    async for batch in ctx.follow(spec.id):
        yield 0, batch


async def _chunks(
    ctx: ApiContext, specs: list[JobSpec], model: ChunkModel, head: dict[str, Any], body: OpenAIBody,
    choice: Callable[[int, JobEvent, Ending | None], Any], ended: set[int],
) -> AsyncIterator[str]:
    """The jobs' events as OpenAI chunks, interleaved as they come (`choice` renders an event as the
    choice of that `index`: job i's choice c is index i × n + c, as OpenAI numbers several prompts'
    choices; each choice ends with its own finish_reason), the usage chunk (summed) if asked for,
    then `[DONE]`; the chunks of one batch of events (ApiContext.follow) go out as one write. With
    include_usage every chunk carries `usage`: null but in the last, or with
    `continuous_usage_stats` the usage so far (prompts and the tokens generated until that chunk).
    A job that fails ends the stream with an error event; the others are then cancelled. `ended`:
    the jobs seen to end."""
    include_usage, continuous = body.include_usage, body.continuous_usage
    prompt_tokens, generated = sum(len(s.prompt_ids) for s in specs), 0
    results: dict[int, JobResult] = {}
    write = ChunkWriter(model, head, include_usage)
    batches = _one(ctx, specs[0]) if len(specs) == 1 else follow_all(ctx, specs)
    async with aclosing(batches):
        async for i, batch in batches:
            if batch is None:
                yield KEEP_ALIVE
                continue
            chunks: list[str] = []
            for event in batch:
                result: JobResult | None = None
                if event.final:
                    result = event.result
                    ended.add(i)
                    if result is None or result.status is not JobStatus.SUCCEEDED:
                        yield "".join([*chunks, error_event(failure(result))])
                        return
                    results[i] = result
                index = i * specs[i].n + event.choice
                generated += event.token is not None
                so_far = CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=generated,
                                         total_tokens=prompt_tokens + generated) if continuous else None
                chunks.append(sse(write(choice(index, event, event.choice_end or result), so_far)))
            yield "".join(chunks)
            if len(results) == len(specs):
                break
    if include_usage and len(results) == len(specs):
        total = summed_usage([usage(results[i], spec) for i, spec in enumerate(specs)])
        yield sse(model(**head, choices=[], usage=total).model_dump_json())
    yield DONE


async def _cancel_unended(ctx: ApiContext, specs: list[JobSpec], ended: set[int]) -> None:
    for i, spec in enumerate(specs):
        if i not in ended:
            ctx.cancel_soon(spec.id)


Choice = Callable[[int, JobEvent, Ending | None], Any]


def _stream_jobs(ctx: ApiContext, specs: list[JobSpec], model: ChunkModel, head: dict[str, Any],
                 body: OpenAIBody, choice: Choice) -> StreamingResponse:
    """The streaming answer for the jobs. Once it is over, however it ended (a client gone before
    the first event never started the generators, whose cleanup would cancel its jobs), every job
    it did not see end is cancelled."""
    ended: set[int] = set()
    response = stream(_chunks(ctx, specs, model, head, body, choice, ended), error_event,
                      ",".join(spec.id for spec in specs))
    response.background = BackgroundTask(_cancel_unended, ctx, specs, ended)
    return response


@router.post("/chat/completions", response_model=ChatCompletion, responses=_stream_doc("ChatCompletionChunk"))
async def chat_completions(body: ChatCompletionRequest, request: Request, tenant: str = Depends(tenant)):  # type: ignore[no-untyped-def]
    """Chat completion; `stream: true` streams chunks. A client that disconnects cancels its job."""
    ctx = ApiContext.of(request)
    check_stream_options(body)
    served = ctx.models.route(body.model)
    spec = chat_job(ctx.settings, served.tokenizer, served.chat_template, body, tenant)
    spec.model = served.queue
    await ctx.jobs.submit(spec)
    common = _head("chatcmpl", spec, ctx)
    if body.stream:
        tool_streams: dict[int, ToolStream] = {}  # each choice's tool-call parser

        def choice(i: int, event: JobEvent, result: Ending | None) -> ChunkChoice:
            content: str | None = text_of(event)
            calls = None
            reason = finish_reason(result) if result else None
            if tool_calls.mode(body) != "none":
                tools = tool_streams.setdefault(i, ToolStream(body))
                content, calls = tools.feed(text_of(event), result is not None, cut_off=reason == "length")
                reason = tool_calls.finish_reason(tools.called, reason) if reason else None
            return ChunkChoice(
                index=i,
                delta=ChunkDelta(content=content, tool_calls=calls),
                logprobs=chat_logprobs([event]) if body.logprobs else None,
                finish_reason=reason,  # type: ignore[arg-type]
            )

        return _stream_jobs(ctx, [spec], ChatCompletionChunk, common, body, choice)
    events = await ctx.collect(spec.id, request)
    completion = chat_answer(ctx, spec, body, events)
    return JSONResponse(completion.model_dump(mode="json"), headers={"X-Job-Id": spec.id})


def chat_answer(ctx: ApiContext, spec: JobSpec, body: ChatCompletionRequest,
                events: list[JobEvent]) -> ChatCompletion:
    """The non-streaming answer of a finished chat job (also a batch line's `response.body`)."""
    result = succeeded(events[-1])
    return ChatCompletion(
        **_head("chatcmpl", spec, ctx),
        choices=[chat_choice(body, i, c, events_of(events, c.index))
                 for i, c in enumerate(best(result, spec.n))],
        usage=usage(result, spec),
    )


@router.post("/completions", response_model=Completion, responses=_stream_doc("Completion"))
async def completions(body: CompletionRequest, request: Request, tenant: str = Depends(tenant)):  # type: ignore[no-untyped-def]
    """Text completion of a raw prompt (no chat template); `stream: true` streams chunks. Several
    prompts (a list of strings or of token-id lists) are one job each: choice `index` is the
    prompt's, streamed chunks interleave, usage is summed. `X-Job-Id` lists the jobs, comma-separated."""
    ctx = ApiContext.of(request)
    check_stream_options(body)
    served = ctx.models.route(body.model)
    specs = completion_jobs(ctx.settings, served.tokenizer, body, tenant)
    for spec in specs:
        spec.model = served.queue
    await submit_all(ctx, specs)
    job_ids = ",".join(spec.id for spec in specs)
    if body.stream:
        n = body.n
        echo = {i * n + c: served.tokenizer.decode(spec.prompt_ids)
                for i, spec in enumerate(specs) for c in range(n)} if body.echo else {}
        offsets = [0] * (len(specs) * n)  # text_offset: where each choice's next text starts

        def choice(i: int, event: JobEvent, result: Ending | None) -> CompletionChoice:
            text = echo.pop(i, "") + text_of(event)
            logprobs = None
            if body.logprobs is not None:
                logprobs = completion_logprobs([event], offsets[i] + len(text) - len(text_of(event)),
                                                body.echo)
            offsets[i] += len(text)
            return CompletionChoice(
                index=i, text=text, logprobs=logprobs,
                finish_reason=finish_reason(result) if result else None,  # type: ignore[arg-type]
            )

        return _stream_jobs(ctx, specs, Completion, _head("cmpl", specs[0], ctx), body, choice)
    if len(specs) == 1:
        events = await ctx.collect(specs[0].id, request)
        completion = completion_answer(ctx, specs[0], body, events)
    else:
        answers = [completion_answer(ctx, spec, body, events)
                   for spec, events in zip(specs, await collect_all(ctx, specs, request), strict=True)]
        completion = answers[0].model_copy(update={
            "choices": [c.model_copy(update={"index": i})
                        for i, c in enumerate(c for a in answers for c in a.choices)],
            "usage": summed_usage([a.usage for a in answers if a.usage is not None]),
        })
    return JSONResponse(completion.model_dump(mode="json"), headers={"X-Job-Id": job_ids})


def completion_answer(ctx: ApiContext, spec: JobSpec, body: CompletionRequest,
                      events: list[JobEvent]) -> Completion:
    """The non-streaming answer of a finished completion job (also a batch line's `response.body`)."""
    result = succeeded(events[-1])
    prompt_text = ctx.models.route(spec.model).tokenizer.decode(spec.prompt_ids) if body.echo else ""
    return Completion(
        **_head("cmpl", spec, ctx),
        choices=[CompletionChoice(
            index=i, text=prompt_text + c.generated_text,
            logprobs=completion_logprobs(events_of(events, c.index), len(prompt_text), body.echo,
                                          prompt_of(events)) if body.logprobs is not None else None,
            finish_reason=finish_reason(c))  # type: ignore[arg-type]
            for i, c in enumerate(best(result, spec.n))],
        usage=usage(result, spec),
    )


def _model(ctx: ApiContext, name: str) -> Model:
    return Model(id=name, created=int(time.time()), max_model_len=ctx.settings.max_total_tokens)


@router.get("/models", response_model=ModelList, responses=error_responses("openai", 401))
async def models(request: Request, _tenant: str = Depends(tenant)) -> ModelList:
    """The models this service runs: the configured ones and their aliases, then any other that a
    live worker reports (conveyor/jobqueue/models.py)."""
    ctx = ApiContext.of(request)
    catalog = ctx.models.catalog
    if catalog.single:
        return ModelList(data=[_model(ctx, ctx.model_id)])
    names = [*catalog.names, *catalog.aliases]
    workers = await live_workers(ctx)
    reported = {name for worker in workers for name in (worker.model, *worker.aliases) if name}
    return ModelList(data=[_model(ctx, name) for name in [*names, *sorted(reported - set(names))]])


@router.get("/models/{model_id:path}", response_model=Model,
            responses=error_responses("openai", 401, 404, notes={404: "No such model"}))
async def model(model_id: str, request: Request, _tenant: str = Depends(tenant)) -> Model:
    """One model, by id (a configured model's name or alias)."""
    ctx = ApiContext.of(request)
    if ctx.models.catalog.single and model_id != ctx.model_id:
        raise ModelNotFound(f"model {model_id!r} is not served here; this service runs {ctx.model_id!r}",
                            param="model")
    ctx.models.route(model_id)  # ModelNotFound for a name nobody configured
    return _model(ctx, model_id)
