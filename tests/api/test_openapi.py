"""The OpenAPI schema documents every route and every error it answers, in the route's dialect."""

from __future__ import annotations

import json

import pytest

from api.app import create_app
from schemas.settings import Settings


@pytest.fixture(scope="module")
def schema(tiny_model_dir) -> dict:  # type: ignore[no-untyped-def]
    app = create_app(Settings(redis_url="redis://127.0.0.1:1"), tiny_model_dir, "tiny")
    return app.openapi()


GENERATION = {("post", "/generate"), ("post", "/generate_stream"), ("post", "/"),
              ("post", "/v1/chat/completions"), ("post", "/v1/completions"), ("post", "/v1/jobs")}
ROUTES = GENERATION | {("get", "/v1/models"), ("get", "/v1/models/{model_id}"), ("get", "/v1/jobs"),
                       ("get", "/v1/jobs/{job_id}"), ("get", "/v1/jobs/{job_id}/events"),
                       ("delete", "/v1/jobs/{job_id}"), ("get", "/health"), ("get", "/ready"),
                       ("get", "/info"), ("get", "/metrics")}


def test_every_route_is_documented(schema: dict) -> None:
    documented = {(m, p) for p, ops in schema["paths"].items() for m in ops}
    assert documented == ROUTES


def test_generation_routes_document_every_error_in_their_dialect(schema: dict) -> None:
    for method, path in GENERATION:
        responses = schema["paths"][path][method]["responses"]
        assert {"400", "401", "413", "422", "429", "500"} <= set(responses), (method, path)
        error = "OpenAIErrorResponse" if path.startswith("/v1") else "ErrorResponse"
        for status in ("400", "401", "413", "422", "429", "500"):
            ref = responses[status]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/" + error), (path, status, ref)


def test_authenticated_routes_say_so_and_document_401(schema: dict) -> None:
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            if path in ("/health", "/ready", "/info", "/metrics"):
                assert "security" not in op
            else:
                assert op["security"] == [{"HTTPBearer": []}] and "401" in op["responses"], (method, path)
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_every_reference_resolves_and_no_framework_error_shape_is_left(schema: dict) -> None:
    text = json.dumps(schema)
    assert "HTTPValidationError" not in text
    refs = {part.split('"')[0] for part in text.split('"$ref": "#/components/schemas/')[1:]}
    assert refs <= set(schema["components"]["schemas"]), refs - set(schema["components"]["schemas"])
    for name in ("StreamResponse", "ChatCompletionChunk", "Completion", "JobEvent"):
        assert name in refs
