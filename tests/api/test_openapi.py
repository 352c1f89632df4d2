"""The OpenAPI schema documents every route and every error it answers, in the route's dialect."""

from __future__ import annotations

import json

import pytest

from conveyor.api.app import create_app
from conveyor.settings import Settings


@pytest.fixture(scope="module")
def schema(tiny_model_dir) -> dict:  # type: ignore[no-untyped-def]
    app = create_app(Settings(redis_url="redis://127.0.0.1:1"), tiny_model_dir, "tiny")
    return app.openapi()


GENERATION = {("post", "/generate"), ("post", "/generate_stream"), ("post", "/"),
              ("post", "/v1/chat/completions"), ("post", "/v1/completions"), ("post", "/v1/jobs")}
ROUTES = GENERATION | {("get", "/v1/models"), ("get", "/v1/models/{model_id}"), ("get", "/v1/jobs"),
                       ("get", "/v1/jobs/{job_id}"), ("get", "/v1/jobs/{job_id}/events"),
                       ("delete", "/v1/jobs/{job_id}"), ("get", "/health"), ("get", "/ready"),
                       ("get", "/info"), ("get", "/metrics"), ("get", "/queue"), ("post", "/tokenize"),
                       ("post", "/detokenize"),
                       # OpenAI's Batch API
                       ("post", "/v1/files"), ("get", "/v1/files"), ("get", "/v1/files/{file_id}"),
                       ("get", "/v1/files/{file_id}/content"), ("delete", "/v1/files/{file_id}"),
                       ("post", "/v1/batches"), ("get", "/v1/batches"), ("get", "/v1/batches/{batch_id}"),
                       ("post", "/v1/batches/{batch_id}/cancel"),
                       # the console's data and the operators' dead-letter endpoints
                       ("get", "/v1/console/overview"), ("get", "/v1/admin/dead-letters"),
                       ("post", "/v1/admin/dead-letters/{entry_id}/requeue"),
                       ("delete", "/v1/admin/dead-letters/{entry_id}")}


def test_every_route_is_documented(schema: dict) -> None:
    documented = {(m, p) for p, ops in schema["paths"].items() for m in ops}
    assert documented == ROUTES


def _error_ref(response: dict) -> str:
    return response["content"]["application/json"]["schema"]["$ref"]


def test_generation_routes_document_every_error_in_their_dialect(schema: dict) -> None:
    statuses = ("400", "401", "413", "422", "429", "500", "503")
    for method, path in GENERATION:
        responses = schema["paths"][path][method]["responses"]
        assert set(statuses) <= set(responses), (method, path)
        error = "OpenAIErrorResponse" if path.startswith("/v1") else "ErrorResponse"
        for status in statuses:
            assert _error_ref(responses[status]).endswith("/" + error), (path, status)
        for status in ("429", "503"):  # both say when to retry
            assert responses[status]["headers"]["Retry-After"]["schema"] == {"type": "integer"}


# The errors each other route can answer (besides 401 on every authenticated one), in OpenAI's shape.
OTHER_ERRORS = {("get", "/v1/models/{model_id}"): {"404"}, ("get", "/v1/jobs"): {"422", "503"},
                ("get", "/v1/jobs/{job_id}"): {"404", "503"}, ("get", "/v1/jobs/{job_id}/events"): {
                    "404", "422", "503"}, ("delete", "/v1/jobs/{job_id}"): {"404", "503"}}


def test_job_and_model_routes_document_their_errors(schema: dict) -> None:
    for (method, path), statuses in OTHER_ERRORS.items():
        responses = schema["paths"][path][method]["responses"]
        assert statuses <= set(responses), (method, path, sorted(responses))
        for status in statuses:
            assert _error_ref(responses[status]).endswith("/OpenAIErrorResponse"), (path, status)


def test_event_streams_are_events_whose_data_is_text_naming_their_payload(schema: dict) -> None:
    streams = {"/generate_stream": ("StreamResponse", "ErrorResponse", False),
               "/": ("StreamResponse", "ErrorResponse", False),
               "/v1/chat/completions": ("ChatCompletionChunk", "OpenAIErrorResponse", True),
               "/v1/completions": ("Completion", "OpenAIErrorResponse", True),
               "/v1/jobs/{job_id}/events": ("JobEvent", "OpenAIErrorResponse", False)}
    for path, (component, error, done) in streams.items():
        operation = schema["paths"][path].get("post") or schema["paths"][path]["get"]
        sse = operation["responses"]["200"]["content"]["text/event-stream"]
        event = sse["schema"]  # one SSE event: the wire holds text, not one JSON object
        assert event["type"] == "object" and event["required"] == ["data"], path
        data = event["properties"]["data"]["anyOf"]
        assert all(d["type"] == "string" for d in data), path
        payloads = [d["contentSchema"]["$ref"].rsplit("/", 1)[1] for d in data if "contentSchema" in d]
        assert payloads == [component, error], path
        assert ({"type": "string", "const": "[DONE]"} in data) is done, path
        assert component in event["description"], path
        assert sse["x-event-data"] == {"$ref": f"#/components/schemas/{component}"}, path


def test_health_documents_no_body_and_metrics_text(schema: dict) -> None:
    assert "content" not in schema["paths"]["/health"]["get"]["responses"]["200"]
    content = schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert [c["schema"] for c in content.values()] == [{"type": "string"}]


def test_authenticated_routes_say_so_and_document_401(schema: dict) -> None:
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            if path in ("/health", "/ready", "/info", "/queue", "/metrics"):
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
