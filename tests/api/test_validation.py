"""Every parameter out of range is 422 naming the field (TGI's shape, or OpenAI's on /v1); malformed JSON
is 400, an oversized body 413; no job is created for a rejected request and the service keeps serving.
Runs on the api without a worker (max_input_tokens 1000, max_total_tokens 2048, payload_limit 100000)."""

from __future__ import annotations

import httpx
import pytest
from redis import Redis

from conveyor.jobqueue.keys import Keys
from tests.api.conftest import auth

LONG_PROMPT = "hello " * 1500  # ~1500 tokens > max_input_tokens = 1000
MSG = [{"role": "user", "content": "hi"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

TGI = [
    ({"parameters": {}}, "inputs"),
    ({"inputs": ""}, "inputs"),
    ({"inputs": "hi", "parameters": {"max_new_tokens": 0}}, "max_new_tokens"),
    ({"inputs": "hi", "parameters": {"max_new_tokens": 5000}}, "max_new_tokens"),
    ({"inputs": "hi", "parameters": {"temperature": 0}}, "temperature"),
    ({"inputs": "hi", "parameters": {"temperature": 101}}, "temperature"),
    ({"inputs": "hi", "parameters": {"top_p": 1.5}}, "top_p"),
    ({"inputs": "hi", "parameters": {"top_p": 0}}, "top_p"),
    ({"inputs": "hi", "parameters": {"top_k": 0}}, "top_k"),
    ({"inputs": "hi", "parameters": {"typical_p": 1.5}}, "typical_p"),
    ({"inputs": "hi", "parameters": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"inputs": "hi", "parameters": {"frequency_penalty": 3}}, "frequency_penalty"),
    ({"inputs": "hi", "parameters": {"presence_penalty": -3}}, "presence_penalty"),
    ({"inputs": "hi", "parameters": {"seed": -1}}, "seed"),
    ({"inputs": "hi", "parameters": {"stop": ["a", "b", "c", "d", "e"]}}, "stop"),
    ({"inputs": "hi", "parameters": {"stop": [""]}}, "stop"),
    ({"inputs": "hi", "parameters": {"top_n_tokens": 50}}, "top_n_tokens"),
    ({"inputs": "hi", "parameters": {"truncate": 0}}, "truncate"),
    ({"inputs": "hi", "parameters": {"truncate": 5000}}, "truncate"),
    ({"inputs": "hi", "parameters": {"best_of": 2}}, "best_of"),
    ({"inputs": "hi", "parameters": {"watermark": True}}, "watermark"),
    ({"inputs": "hi", "parameters": {"grammar": {"type": "regex", "value": "a(b"}}}, "grammar"),
    ({"inputs": "hi", "parameters": {"grammar": {"type": "json", "value": {"type": "bogus"}}}}, "grammar"),
    ({"inputs": "hi", "parameters": {"grammar": {"type": "json", "value": "{not json"}}}, "grammar"),
    ({"inputs": "hi", "parameters": {"grammar": {"type": "ebnf", "value": "x"}}}, "grammar"),
    ({"inputs": "hi", "parameters": {"grammar": {"type": "json", "value": {
        "type": "object", "description": "x" * 70000}}}}, "grammar"),  # over max_grammar_bytes
    ({"inputs": "hi", "parameters": {"max_new_tokens": "many"}}, "max_new_tokens"),
]
CHAT = [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    ({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": ""}]},
     "messages.1.content"),
    ({"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
    ({"messages": MSG, "temperature": 2.5}, "temperature"),
    ({"messages": MSG, "top_p": 0}, "top_p"),
    ({"messages": MSG, "n": 9}, "n"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ({"messages": MSG, "max_tokens": 5000}, "max_tokens"),
    ({"messages": MSG, "max_completion_tokens": 5000}, "max_completion_tokens"),
    ({"messages": MSG, "frequency_penalty": -3}, "frequency_penalty"),
    ({"messages": MSG, "presence_penalty": 3}, "presence_penalty"),
    ({"messages": MSG, "seed": -1}, "seed"),
    ({"messages": MSG, "logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    ({"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": MSG, "logit_bias": {"x": 5}}, "logit_bias"),
    ({"messages": MSG, "logit_bias": {"1": 101}}, "logit_bias"),
    ({"messages": MSG, "logit_bias": {"1": -100.5}}, "logit_bias"),
    ({"messages": MSG, "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"messages": MSG, "logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ({"messages": MSG, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": MSG, "tools": [{"type": "function", "function": {}}]}, "tools.0.function.name"),
    ({"messages": MSG, "tools": [{"type": "retrieval"}]}, "tools.0"),
    ({"messages": MSG, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nope"}}}}}], "tool_choice": "required"}, "tools"),
    ({"messages": MSG, "tool_choice": "auto"}, "tool_choice"),
    ({"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "any"},
     "tool_choice"),
    ({"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [*MSG, {"role": "assistant", "tool_calls": [{"id": "1", "function": {}}]}]},
     "messages.1.tool_calls"),
    ({"messages": [*MSG, {"role": "assistant", "tool_calls": [CALL]}]}, "messages.1.tool_calls"),
    ({"messages": [*MSG, {"role": "assistant", "tool_calls": [CALL]}, *MSG]}, "messages.1.tool_calls"),
    ({"messages": [*MSG, {"role": "assistant", "tool_calls": [CALL]},
                   {"role": "tool", "tool_call_id": "call_2", "content": "sun"}]}, "messages.1.tool_calls"),
    ({"messages": MSG, "response_format": {"type": "yaml"}}, "response_format"),
    ({"messages": MSG, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}},
     "response_format.json_schema.schema"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content"),
]
COMPLETION = [
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", ""]}, "prompt.1"),
    ({"prompt": [[1, 2], [99999999]]}, "prompt.1"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "logprobs": 1, "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "stream": False, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "hi", "logit_bias": {"1.5": 1}}, "logit_bias"),
    ({"prompt": [99999999]}, "prompt"),
    ({"prompt": "hi", "logprobs": 6}, "logprobs"),
    ({"prompt": "hi", "n": 2, "best_of": 1}, "best_of"),
    ({"prompt": "hi", "suffix": "x"}, "suffix"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "response_format": {"type": "regex", "value": "[a-"}}, "response_format"),
]
JOB = [
    ({"inputs": "hi", "priority": 101}, "priority"),
    ({"inputs": "hi", "ttl": 0}, "ttl"),
    ({"prompt": ["a", "b"]}, "prompt"),  # an async job runs one prompt
    ({"inputs": "hi", "ttl": 10, "deadline": 4102444800}, "ttl"),
    ({"inputs": "hi", "deadline": 1000}, "deadline"),
    ({"inputs": "hi", "webhook": {"url": "ftp://x.example/h"}}, "webhook.url"),
    ({"inputs": "hi", "webhook": {"url": "https://x.example/h", "events": ["done"]}}, "webhook.events"),
    ({"messages": MSG, "temperature": 9}, "temperature"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"inputs": "hi", "parameters": {"top_p": 2}}, "parameters.top_p"),
]
CASES = ([("/generate", b, f) for b, f in TGI] + [("/generate_stream", b, f) for b, f in TGI[:4]]
         + [("/", b, f) for b, f in TGI[:2]] + [("/v1/chat/completions", b, f) for b, f in CHAT]
         + [("/v1/completions", b, f) for b, f in COMPLETION] + [("/v1/jobs", b, f) for b, f in JOB])


def queued(service) -> int:  # type: ignore[no-untyped-def]
    """Entries in the jobs streams: each accepted request adds one."""
    with Redis.from_url(service.redis_url, decode_responses=True) as redis:
        return sum(redis.xlen(s) for s in Keys(service.env["CONVEYOR_KEY_PREFIX"]).jobs_streams)


@pytest.fixture
def no_new_job(queue_service):  # type: ignore[no-untyped-def]
    before = queued(queue_service)
    yield
    assert queued(queue_service) == before, "a rejected request created a job"


@pytest.mark.parametrize(("route", "body", "field"), CASES, ids=[f"{r}:{f}" for r, _b, f in CASES])
def test_out_of_range_is_422_naming_the_field(queue_service, no_new_job, route: str, body: dict,  # type: ignore[no-untyped-def]
                                              field: str) -> None:
    r = httpx.post(queue_service.base_url + route, json=body, headers=auth("alice"), timeout=30)
    assert r.status_code == 422, r.text
    if route.startswith("/v1"):
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"].startswith(field) and field in error["message"], error
    else:
        data = r.json()
        assert data["error_type"] == "validation" and field in data["error"], data


@pytest.mark.parametrize(("route", "body", "field"), [
    ("/generate", {"inputs": LONG_PROMPT}, "inputs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG_PROMPT}]}, "messages"),
    ("/v1/completions", {"prompt": LONG_PROMPT}, "prompt"),
])
def test_prompt_over_max_input_tokens_names_both_numbers(queue_service, no_new_job, route: str, body: dict,  # type: ignore[no-untyped-def]
                                                         field: str) -> None:
    r = httpx.post(queue_service.base_url + route, json=body, headers=auth("alice"), timeout=30)
    assert r.status_code == 422, r.text
    message = r.json()["error"] if route == "/generate" else r.json()["error"]["message"]
    assert f"`{field}` must have less than 1000 tokens. Given: 1" in message, message
    if route != "/generate":
        assert r.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("route", ["/generate", "/generate_stream", "/", "/v1/chat/completions",
                                   "/v1/completions", "/v1/jobs"])
def test_malformed_json_is_400_and_oversized_body_413(queue_service, no_new_job, route: str) -> None:  # type: ignore[no-untyped-def]
    base, headers = queue_service.base_url, {**auth("alice"), "Content-Type": "application/json"}
    r = httpx.post(base + route, content=b'{"inputs": "hi",', headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    big = b'{"inputs": "' + b"x" * 200_000 + b'"}'
    r = httpx.post(base + route, content=big, headers=headers, timeout=30)
    assert r.status_code == 413, r.text
    message = r.json()["error"]["message"] if route.startswith("/v1") else r.json()["error"]
    assert "payload_limit (100000 bytes)" in message
    r = httpx.post(base + route, content=iter([big[:60_000], big[60_000:]]), headers=headers, timeout=30)
    assert r.status_code == 413, r.text  # sent without a Content-Length: counted as it arrives


@pytest.mark.parametrize(("path", "headers", "field"), [
    ("/v1/jobs?limit=0", {}, "limit"),
    ("/v1/jobs?limit=101", {}, "limit"),
    ("/v1/jobs?after=nosuchjob", {}, "after"),
    ("/v1/jobs/abc/events", {"Last-Event-ID": "x"}, "Last-Event-ID"),
])
def test_bad_query_or_header_is_422(queue_service, path: str, headers: dict, field: str) -> None:  # type: ignore[no-untyped-def]
    r = httpx.get(queue_service.base_url + path, headers={**auth("alice"), **headers}, timeout=30)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == field


def test_bad_idempotency_key_is_422(queue_service, no_new_job) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(queue_service.base_url + "/v1/jobs", json={"inputs": "hi"},
                   headers={**auth("alice"), "Idempotency-Key": "k" * 300}, timeout=30)
    assert r.status_code == 422 and r.json()["error"]["param"] == "Idempotency-Key"


def test_unknown_route_and_method_in_the_dialect_shape(queue_service) -> None:  # type: ignore[no-untyped-def]
    r = httpx.get(queue_service.base_url + "/nope")
    assert r.status_code == 404 and r.json()["error_type"] == "not_found"
    r = httpx.get(queue_service.base_url + "/v1/chat/completions", headers=auth("alice"))
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
