"""The OpenAPI schema, made true to what the api answers.

FastAPI documents request validation failures as its own `HTTPValidationError`; this api answers
them in the route's dialect (TGI's `ErrorResponse`, or `OpenAIErrorResponse` on /v1), so those
entries are replaced. Event-stream payloads (which no route returns as JSON) are added as schemas.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from api.errors import is_openai_path
from schemas.job import JobEvent
from schemas.openai import ChatCompletionChunk, Completion, OpenAIErrorResponse
from schemas.tgi import ErrorResponse, StreamResponse

STREAM_MODELS: tuple[type[BaseModel], ...] = (StreamResponse, ChatCompletionChunk, Completion, JobEvent)
REF = "#/components/schemas/{model}"


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
                response["description"] = "Invalid parameter (the message names it and its limit)"
                content["schema"] = {"$ref": REF.format(model=error)}
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    app.openapi_schema = schema
    return schema
