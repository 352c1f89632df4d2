"""The README's curl example, end to end: api → Redis stream → worker → pub/sub → SSE."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.slow

CURL_BODY = {"inputs": "What is the capital of France?", "parameters": {"max_new_tokens": 20}}


def read_sse(response: httpx.Response) -> list[dict]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            events.append(json.loads(line[len("data:"):]))
    return events


def test_generate_stream_says_paris(service) -> None:  # type: ignore[no-untyped-def]
    with httpx.stream("POST", service.base_url + "/generate_stream", json=CURL_BODY, timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        events = read_sse(r)
    assert events, "no SSE events"
    assert [e["index"] for e in events] == list(range(len(events)))
    for e in events:
        assert set(e["token"]) >= {"id", "text", "logprob", "special"}
    final = events[-1]
    assert final["generated_text"] is not None
    assert final["details"]["finish_reason"] in ("length", "eos_token", "stop_sequence")
    assert final["details"]["generated_tokens"] == len(events)
    streamed = "".join(e["token"]["text"] for e in events if not e["token"]["special"])
    assert streamed == final["generated_text"]
    assert "Paris" in streamed
    assert all(e["generated_text"] is None for e in events[:-1])


def test_generate_returns_the_same_text(service) -> None:  # type: ignore[no-untyped-def]
    body = {**CURL_BODY, "parameters": {"max_new_tokens": 20, "details": True}}
    r = httpx.post(service.base_url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    assert "Paris" in data["generated_text"]
    assert data["details"]["generated_tokens"] == len(data["details"]["tokens"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"parameters": {"max_new_tokens": 5}}, "inputs"),
        ({"inputs": "hi", "parameters": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"inputs": "hi", "parameters": {"max_new_tokens": 10_000_000}}, "max_new_tokens"),
        ({"inputs": "hi", "parameters": {"temperature": -1}}, "temperature"),
        ({"inputs": "hi", "parameters": {"top_p": 1.5}}, "top_p"),
        ({"inputs": "hi", "parameters": {"stop": ["a", "b", "c", "d", "e"]}}, "stop"),
        ({"inputs": "hi", "parameters": {"top_n_tokens": 50}}, "top_n_tokens"),
        ({"inputs": "hi", "parameters": {"watermark": True}}, "watermark"),
    ],
)
def test_bad_input_is_422_in_tgi_shape(service, body: dict, field: str) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(service.base_url + "/generate_stream", json=body, timeout=30)
    assert r.status_code == 422, r.text
    data = r.json()
    assert data["error_type"] == "validation"
    assert field in data["error"]


def test_invalid_json_is_400_and_service_keeps_serving(service) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(service.base_url + "/generate_stream", content=b"{not json",
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error_type"] == "validation"
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}
    ok = httpx.post(service.base_url + "/generate", json=body, timeout=120)
    assert ok.status_code == 200, ok.text
    assert httpx.get(service.base_url + "/health").status_code == 200
