"""One line of a batch input file → the request it holds → its job, with the endpoint's own checks.

The same checks run at upload (each failing line is reported in the batch's error file, never as a
500 of the upload) and again when the line is expanded into a job (settings may have changed).
"""

from __future__ import annotations

import json

from pydantic import ValidationError as PydanticError

from conveyor.api.context import ApiContext
from conveyor.api.errors import ApiError
from conveyor.api.requests.openai import chat_job, completion_job
from conveyor.wire.batch import ENDPOINTS, BatchLine, LineError
from conveyor.wire.job import JobSpec
from conveyor.wire.openai import ChatCompletionRequest, CompletionRequest

BATCH_PRIORITY = -100  # the lowest `priority`: the queue's batch band (conveyor/jobqueue/bands.py)

Request = ChatCompletionRequest | CompletionRequest


def _pydantic_message(exc: PydanticError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first.get("loc", ()))
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return (f"{field}: {message}" if field else message), field or None


def parse_line(raw: str, line_no: int) -> BatchLine | LineError:
    """The line's envelope `{custom_id, method, url, body}`, or why it is malformed."""
    try:
        data = json.loads(raw)
        json.dumps(data, ensure_ascii=False).encode()  # a lone surrogate escape cannot be stored
    except (ValueError, UnicodeError) as exc:
        return LineError(code="invalid_json", message=f"line {line_no}: not valid JSON ({exc})")
    custom_id = data.get("custom_id") if isinstance(data, dict) else None
    try:
        line = BatchLine.model_validate(data)
    except PydanticError as exc:
        message, _ = _pydantic_message(exc)
        return LineError(custom_id=custom_id if isinstance(custom_id, str) else None,
                         code="invalid_request", message=f"line {line_no}: {message}")
    if line.url not in ENDPOINTS:
        return LineError(custom_id=line.custom_id, code="invalid_url",
                         message=f"line {line_no}: url {line.url!r} is not served in a batch; "
                                 f"use one of {', '.join(ENDPOINTS)}")
    return line


def request_of(line: BatchLine) -> Request:
    """The line's body as the endpoint's request model (raises pydantic's error)."""
    model = ChatCompletionRequest if line.url == "/v1/chat/completions" else CompletionRequest
    return model.model_validate(line.body)


def line_job(ctx: ApiContext, line: BatchLine, tenant: str) -> JobSpec | LineError:
    """The job of a valid line, or the error the endpoint would have answered for its body."""
    try:
        request = request_of(line)
    except PydanticError as exc:
        message, param = _pydantic_message(exc)
        body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
        return LineError(custom_id=line.custom_id, code="invalid_request", message=message,
                         status_code=422, body=body)
    if request.stream:
        return LineError(custom_id=line.custom_id, code="invalid_request",
                         message="`stream` is not supported in a batch: remove it")
    try:
        served = ctx.models.route(request.model)  # each line's own model: one file may mix them
        if isinstance(request, ChatCompletionRequest):
            spec = chat_job(ctx.settings, served.tokenizer, served.chat_template, request, tenant)
        else:
            spec = completion_job(ctx.settings, served.tokenizer, request, tenant)
        spec.model = served.queue
        return spec
    except ApiError as exc:
        return LineError(custom_id=line.custom_id, code=exc.code or "invalid_request", message=exc.message,
                         status_code=exc.status_code, body=exc.openai_body())


def check_lines(ctx: ApiContext, lines: list[str], tenant: str) -> dict[int, LineError]:
    """Every line's error found at upload, by index: malformed, unknown url, duplicate custom_id,
    a body the endpoint refuses."""
    seen: set[str] = set()
    invalid: dict[int, LineError] = {}
    for i, raw in enumerate(lines):
        parsed = parse_line(raw, i + 1)
        if isinstance(parsed, BatchLine):
            if parsed.custom_id in seen:
                parsed = LineError(custom_id=parsed.custom_id, code="duplicate_custom_id",
                                   message=f"line {i + 1}: custom_id {parsed.custom_id!r} is used by an "
                                           "earlier line; each line needs its own")
            else:
                seen.add(parsed.custom_id)
                job = line_job(ctx, parsed, tenant)
                parsed = job if isinstance(job, LineError) else parsed
        if isinstance(parsed, LineError):
            invalid[i] = parsed
    return invalid
