"""The OpenAPI document, true to what the api answers.

`error_responses` is the one table of error statuses that routes declare, each in its dialect's
model (TGI's `ErrorResponse`, OpenAI's `OpenAIErrorResponse` on /v1), with the `Retry-After` header
where it is sent; `event_stream` declares an SSE answer as what it is on the wire (text), naming the
component each `data:` line holds. FastAPI's own `HTTPValidationError` is replaced by the dialect's
error, and the event payloads (which no route answers as JSON) are added as components.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from conveyor.api.errors import is_openai_path
from conveyor.api.responses.sse import MEDIA_TYPE
from conveyor.wire.job import JobEvent
from conveyor.wire.openai import ChatCompletionChunk, Completion, OpenAIErrorResponse
from conveyor.wire.tgi import ErrorResponse, StreamResponse

Dialect = Literal["tgi", "openai"]
Responses = dict[int | str, dict[str, Any]]

STREAM_MODELS: tuple[type[BaseModel], ...] = (StreamResponse, ChatCompletionChunk, Completion, JobEvent)
REF = "#/components/schemas/{model}"
MODELS: dict[Dialect, type[BaseModel]] = {"tgi": ErrorResponse, "openai": OpenAIErrorResponse}
DESCRIPTIONS = {
    400: "Malformed JSON",
    401: "Missing or invalid API key",
    403: "The key's tenant is not in `admin_tenants`",
    404: "Not found",
    409: "The job is queued or running already",
    413: "Request body larger than payload_limit",
    422: "Invalid parameter (the message names it and its limit; OpenAI's `param` names it too)",
    429: "Model is overloaded: retry after `Retry-After` seconds",
    500: "Generation error (the job failed)",
    503: "Redis (the job store) is unavailable: retry after `Retry-After` seconds",
}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying", "required": True,
                               "schema": {"type": "integer"}}}
BODY_ERRORS = (400, 401, 413, 422, 429, 500, 503)  # what a generation request can answer


def error_responses(dialect: Dialect, *statuses: int, notes: dict[int, str] | None = None) -> Responses:
    """The `responses=` entries of these error statuses, in the dialect's error model."""
    out: Responses = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": MODELS[dialect], "description": (notes or {}).get(
            status, DESCRIPTIONS[status])}
        if status in (429, 503):
            entry["headers"] = RETRY_AFTER
        out[status] = entry
    return out


def event_stream(component: str, description: str, dialect: Dialect = "tgi",
                 done: bool = False) -> dict[str, Any]:
    """A 200 answered as SSE, declared as its events (`id`, `event`, `data`, as OpenAPI tools such as
    schemathesis read a stream): each `data:` is one `component` as JSON, or the dialect's error
    that ends a failed stream, or (OpenAI's streams, `done`) the closing `[DONE]`."""
    def json_of(model: str) -> dict[str, Any]:
        return {"type": "string", "contentMediaType": "application/json",
                "contentSchema": {"$ref": REF.format(model=model)}}

    data: list[dict[str, Any]] = [json_of(component), json_of(MODELS[dialect].__name__)]
    if done:
        data.append({"type": "string", "const": "[DONE]"})
    event = {"type": "object", "required": ["data"], "description": f"Server-Sent Events; each `data:` "
             f"is a `{component}` as JSON", "properties": {
                 "id": {"type": "string"}, "event": {"type": "string"}, "data": {"anyOf": data}}}
    return {"description": description, "content": {MEDIA_TYPE: {
        "schema": event, "x-event-data": {"$ref": REF.format(model=component)}}}}


def _add(components: dict[str, Any], model: type[BaseModel]) -> None:
    schema = model.model_json_schema(ref_template=REF, mode="serialization")
    for name, definition in schema.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components.setdefault(model.__name__, schema)


def openapi_schema(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    models: tuple[type[BaseModel], ...] = (*STREAM_MODELS, ErrorResponse, OpenAIErrorResponse)
    for model in models:
        _add(components, model)
    for path, operations in schema.get("paths", {}).items():
        error = "OpenAIErrorResponse" if is_openai_path(path) else "ErrorResponse"
        for operation in operations.values():
            response = operation.get("responses", {}).get("422")
            if response is None:
                continue
            content = response.get("content", {}).get("application/json", {})
            if content.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
                response["description"] = DESCRIPTIONS[422]
                content["schema"] = {"$ref": REF.format(model=error)}
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    app.openapi_schema = schema
    return schema
