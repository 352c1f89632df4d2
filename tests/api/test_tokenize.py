"""`POST /tokenize`: TGI's answer for `{inputs}` (the tokens /generate runs on, with offsets), vLLM's
for `{prompt}` / `{messages}` (the tokens /v1/completions and /v1/chat/completions run on)."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import auth

PROMPT = "Tell me a story about a robot, héhé 世界"
MSG = [{"role": "user", "content": "Name a colour."}]


def tokenize(service, body: dict) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.post(service.base_url + "/tokenize", json=body, headers=auth("alice"), timeout=60)


def detokenize(service, tokens: list[int]) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.post(service.base_url + "/detokenize", json={"tokens": tokens}, headers=auth("alice"),
                      timeout=60)


def test_tgi_shape_is_the_prompt_generate_runs_on(tiny_service) -> None:  # type: ignore[no-untyped-def]
    r = tokenize(tiny_service, {"inputs": PROMPT})
    assert r.status_code == 200, r.text
    tokens = r.json()
    assert tokens and all(set(t) == {"id", "text", "start", "stop"} for t in tokens)
    assert all(t["start"] <= t["stop"] for t in tokens)
    # Character offsets into the prompt; the byte tokens of one character share its span (as in TGI).
    spans = dict.fromkeys((t["start"], t["stop"], t["text"]) for t in tokens)
    assert all(len(text) == stop - start for start, stop, text in spans)
    assert PROMPT in "".join(text for _, _, text in spans)
    with httpx.stream("POST", tiny_service.base_url + "/generate_stream", headers=auth("alice"), timeout=60,
                      json={"inputs": PROMPT, "parameters": {"max_new_tokens": 1}}) as s:
        final = [line for line in s.iter_lines() if line.startswith("data:")][-1]
    assert f'"input_length":{len(tokens)}' in final
    truncated = tokenize(tiny_service, {"inputs": PROMPT, "parameters": {"truncate": 3}}).json()
    assert truncated == tokens[-3:]


def test_vllm_shape_for_a_prompt_and_for_messages(tiny_service) -> None:  # type: ignore[no-untyped-def]
    r = tokenize(tiny_service, {"prompt": PROMPT})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] > 0
    done = httpx.post(tiny_service.base_url + "/v1/completions", headers=auth("alice"), timeout=60,
                      json={"prompt": body["tokens"], "max_tokens": 1}).json()
    text = httpx.post(tiny_service.base_url + "/v1/completions", headers=auth("alice"), timeout=60,
                      json={"prompt": PROMPT, "max_tokens": 1}).json()
    assert done["usage"]["prompt_tokens"] == text["usage"]["prompt_tokens"] == body["count"]
    chat = tokenize(tiny_service, {"messages": MSG}).json()
    answer = httpx.post(tiny_service.base_url + "/v1/chat/completions", headers=auth("alice"), timeout=60,
                        json={"messages": MSG, "max_tokens": 1}).json()
    assert chat["count"] == answer["usage"]["prompt_tokens"]


def test_vllm_without_special_tokens_and_detokenize(tiny_service) -> None:  # type: ignore[no-untyped-def]
    """What `vllm bench serve` builds its prompts with: tokens without the tokenizer's own special
    tokens, and back to text."""
    plain = tokenize(tiny_service, {"prompt": PROMPT, "add_special_tokens": False})
    assert plain.status_code == 200, plain.text
    ids = plain.json()["tokens"]
    r = detokenize(tiny_service, ids)
    assert r.status_code == 200 and r.json() == {"prompt": PROMPT}, r.text
    chat = tokenize(tiny_service, {"messages": MSG}).json()["tokens"]
    assert "<|im_start|>" in detokenize(tiny_service, chat).json()["prompt"]  # special tokens written out
    r = detokenize(tiny_service, [1, 99999999])
    assert r.status_code == 422 and "tokens" in r.json()["error"], r.text


@pytest.mark.parametrize(("body", "field"), [
    ({}, "inputs"),
    ({"inputs": "hi", "prompt": "hi"}, "inputs"),
    ({"inputs": ""}, "inputs"),
    ({"inputs": "hi", "parameters": {"truncate": 0}}, "truncate"),
    ({"inputs": "hi", "parameters": {"truncate": 99999}}, "truncate"),
    ({"messages": []}, "messages"),
])
def test_bad_bodies_are_422_in_tgi_shape(tiny_service, body: dict, field: str) -> None:  # type: ignore[no-untyped-def]
    r = tokenize(tiny_service, body)
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "validation" and field in r.json()["error"]


def test_needs_a_key(tiny_service) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(tiny_service.base_url + "/tokenize", json={"inputs": "hi"}, timeout=60)
    assert r.status_code == 401 and r.json()["error_type"] == "unauthorized"
