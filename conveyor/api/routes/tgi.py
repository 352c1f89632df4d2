"""TGI dialect: /generate, /generate_stream, POST / — one job path, two ways to wait on it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from conveyor.api.auth import tenant
from conveyor.api.body_text import unicode_body
from conveyor.api.context import ApiContext
from conveyor.api.errors import ApiError, ValidationError
from conveyor.api.openapi import BODY_ERRORS, error_responses, event_stream
from conveyor.api.requests.choices import best_by_mean, choices, events_of
from conveyor.api.requests.limits import tgi_job
from conveyor.api.responses.prompt_details import prefill
from conveyor.api.responses.sse import KEEP_ALIVE, failure, sse, stream, succeeded
from conveyor.wire.job import ChoiceResult, EventToken, JobEvent, JobResult, JobSpec, JobStatus
from conveyor.wire.tgi import (
    BestOfSequence,
    CompatGenerateRequest,
    Details,
    GenerateRequest,
    GenerateResponse,
    StreamDetails,
    StreamResponse,
    Token,
)

router = APIRouter(tags=["Text Generation Inference"], dependencies=[Depends(unicode_body)])

ERRORS = error_responses("tgi", *BODY_ERRORS)
STREAM_DOC = ("Server-Sent Events: one `StreamResponse` per token; the last one carries `generated_text` and "
              "`details`; a job that fails mid-way ends with an `ErrorResponse`.")


def _token(t: EventToken) -> Token:
    return Token(id=t.id, text=t.text, logprob=t.logprob, special=t.special)


def _full_text(inputs: str, text: str, return_full_text: bool | None) -> str:
    return inputs + text if return_full_text else text


async def submit(ctx: ApiContext, body: GenerateRequest, tenant: str, stream: bool = False) -> JobSpec:
    spec = tgi_job(ctx.settings, ctx.tokenizer, ctx.chat_template, body.inputs, body.parameters, tenant,
                   stream)
    await ctx.jobs.submit(spec)
    return spec


async def _generate(body: GenerateRequest, request: Request, tenant: str) -> tuple[GenerateResponse, str]:
    ctx = ApiContext.of(request)
    spec = await submit(ctx, body, tenant)
    events = await ctx.collect(spec.id, request)
    result = succeeded(events[-1])
    top, others = best_by_mean(result) if spec.width > 1 else (choices(result)[0], [])
    full = body.parameters.return_full_text
    details = None
    if body.parameters.details:
        sequence = _sequence(body.inputs, full, spec, top, events_of(events, top.index))
        details = Details(**sequence.model_dump(exclude={"generated_text"}), best_of_sequences=[
            _sequence(body.inputs, full, spec, c, events_of(events, c.index)) for c in others] or None)
        if body.parameters.decoder_input_details:  # the one prompt, in every sequence
            details.prefill = prefill(events)
            for other in details.best_of_sequences or []:
                other.prefill = details.prefill
    text = _full_text(body.inputs, top.generated_text, full)
    return GenerateResponse(generated_text=text, details=details), spec.id


def _sequence(inputs: str, full: bool | None, spec: JobSpec, choice: ChoiceResult,
              events: list[JobEvent]) -> BestOfSequence:
    """One sequence's text and details (TGI's `details`, or an entry of `best_of_sequences`)."""
    tokens = [e for e in events if e.token is not None]
    return BestOfSequence(
        generated_text=_full_text(inputs, choice.generated_text, full),
        finish_reason=choice.finish_reason,  # type: ignore[arg-type]
        generated_tokens=choice.completion_tokens or len(tokens),
        seed=choice.seed,
        tokens=[_token(e.token) for e in tokens if e.token is not None],
        top_tokens=[[_token(t) for t in e.top_tokens] for e in tokens] if spec.sampling.top_n_tokens else [],
    )


@router.post("/generate", response_model=GenerateResponse, responses=ERRORS)
async def generate(body: GenerateRequest, request: Request, tenant: str = Depends(tenant)) -> JSONResponse:
    """Generate tokens; answers when the job is done. A client that disconnects cancels its job."""
    response, job_id = await _generate(body, request, tenant)
    return JSONResponse(response.model_dump(mode="json"), headers={"X-Job-Id": job_id})


def error_event(error: ApiError) -> str:
    """TGI's error event: an `ErrorResponse` as the last `data:`."""
    return sse(json.dumps(error.tgi_body()))


def _failed(result: JobResult | None) -> str:
    return error_event(failure(result))


def _token_chunk(event: JobEvent, token: EventToken) -> str:
    """A StreamResponse of a token that does not end the stream, written without building it: the
    api's hot path (one per streamed token). EventToken serializes as TGI's Token (the same fields,
    in the same order); tests/api/test_tgi_stream_render.py holds the two to the same bytes."""
    tops = ",".join(t.model_dump_json() for t in event.top_tokens)
    return (f'{{"index":{event.index},"token":{token.model_dump_json()},"top_tokens":[{tops}],'
            '"generated_text":null,"details":null}')


def _last_chunk(event: JobEvent, token: EventToken, result: JobResult, spec: JobSpec,
                body: GenerateRequest) -> str:
    """The final StreamResponse: the whole text and `details`."""
    response = StreamResponse(index=event.index, token=_token(token),
                              top_tokens=[_token(t) for t in event.top_tokens])
    response.generated_text = _full_text(body.inputs, result.generated_text, body.parameters.return_full_text)
    response.details = StreamDetails(
        finish_reason=result.finish_reason,  # type: ignore[arg-type]
        generated_tokens=result.usage.completion_tokens if result.usage else event.index + 1,
        seed=result.seed,
        input_length=len(spec.prompt_ids),
    )
    return response.model_dump_json()


async def _stream(ctx: ApiContext, spec: JobSpec, body: GenerateRequest) -> AsyncIterator[str]:
    async for batch in ctx.follow(spec.id):
        if batch is None:
            yield KEEP_ALIVE
            continue
        chunks: list[str] = []  # the batch's events, one write
        for event in batch:
            result, token = event.result, event.token
            if token is None:  # a job that ended without a token of its own
                chunks.append(_failed(result))
            elif not event.final:
                chunks.append(sse(_token_chunk(event, token), event.index))
            elif result is None or result.status is not JobStatus.SUCCEEDED:
                chunks.append(_failed(result))
            else:
                chunks.append(sse(_last_chunk(event, token, result, spec, body), event.index))
            if event.final or token is None:
                break
        yield "".join(chunks)


@router.post("/generate_stream", response_class=StreamingResponse,
             responses={**ERRORS, 200: event_stream("StreamResponse", STREAM_DOC)})
async def generate_stream(body: GenerateRequest, request: Request,
                          tenant: str = Depends(tenant)) -> StreamingResponse:
    """Generate tokens, streamed as Server-Sent Events in TGI's shape. A client that disconnects
    cancels its job."""
    ctx = ApiContext.of(request)
    if body.parameters.decoder_input_details:  # as TGI (its router refuses the same)
        raise ValidationError("`decoder_input_details` == true is not supported when streaming tokens",
                              param="decoder_input_details")
    spec = await submit(ctx, body, tenant, stream=True)
    return stream(_stream(ctx, spec, body), error_event, spec.id)


@router.post("/", response_model=list[GenerateResponse], responses={**ERRORS, 200: event_stream(
    "StreamResponse", "A one-element list (as TGI), or with `stream: true` " + STREAM_DOC)})
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
