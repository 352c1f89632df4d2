"""A JSON string with an unpaired surrogate escape (`"\\ud800"`, `"\\udc00"`) is text no tokenizer or
store can take: every generation route and /v1/jobs answers 422 naming the field (TGI's shape, or
OpenAI's with `param`), creates no job, and never answers 500. Runs on the api without a worker."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from conveyor.api.body_text import unpaired_surrogate
from tests.api.conftest import auth
from tests.api.test_validation import queued

HIGH, LOW = "\ud800", "\udc00"  # lone halves: JSON-escaped by json.dumps, as a client would send them
MSG = [{"role": "user", "content": "hi"}]


def _set(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of the body with the value at the dotted path (numbers index lists)."""
    body = json.loads(json.dumps(body))
    *parents, last = path.split(".")
    node: Any = body
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return body


TGI = {"inputs": "hi", "parameters": {"max_new_tokens": 3, "stop": ["x"]}}
TGI_FIELDS = ["inputs", "parameters.stop.0"]
CHAT = {"model": "m", "user": "u", "messages": [{"role": "user", "content": "hi", "name": "n"}],
        "stop": ["x"]}
CHAT_FIELDS = ["messages.0.content", "messages.0.name", "stop.0", "model", "user"]
COMPLETION = {"model": "m", "user": "u", "prompt": "hi", "stop": "x"}
COMPLETION_FIELDS = ["prompt", "stop", "model", "user"]

CASES = [(route, base, field) for route in ("/generate", "/generate_stream", "/") for base, fields in
         [(TGI, TGI_FIELDS)] for field in fields]
CASES += [("/v1/chat/completions", CHAT, f) for f in CHAT_FIELDS]
CASES += [("/v1/completions", COMPLETION, f) for f in COMPLETION_FIELDS]
CASES += [("/v1/jobs", base, f) for base, fields in ((TGI, TGI_FIELDS), (CHAT, CHAT_FIELDS),
                                                      (COMPLETION, COMPLETION_FIELDS)) for f in fields]
CASES += [("/v1/chat/completions", _set(CHAT, "stream", True), "messages.0.content"),
          ("/v1/jobs", _set(CHAT, "messages.0.content", [{"type": "text", "text": "hi"}]),
           "messages.0.content.0.text")]


@pytest.mark.parametrize(("route", "base", "field"), CASES, ids=[f"{r}:{f}" for r, _b, f in CASES])
@pytest.mark.parametrize("lone", [HIGH, LOW], ids=["high", "low"])
def test_unpaired_surrogate_is_422_naming_the_field(queue_service, route: str, base: dict, field: str,  # type: ignore[no-untyped-def]
                                                    lone: str) -> None:
    original = base
    for part in field.split("."):
        original = original[int(part)] if isinstance(original, list) else original[part]
    body = _set(base, field, f"ab{lone}c" if isinstance(original, str) else original)
    before = queued(queue_service)
    r = httpx.post(queue_service.base_url + route, content=json.dumps(body).encode(),
                   headers={**auth("alice"), "Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 422, r.text
    if route.startswith("/v1"):
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == field, error
        message = error["message"]
    else:
        assert r.json()["error_type"] == "validation", r.json()
        message = r.json()["error"]
    assert message.startswith(f"{field}: contains an unpaired surrogate (U+{ord(lone):04X}) at character 2")
    assert queued(queue_service) == before, "a rejected request created a job"


def test_a_valid_pair_and_other_text_are_accepted(queue_service) -> None:  # type: ignore[no-untyped-def]
    """An escaped pair (`"\\ud83d\\ude00"`) is one character, 😀: accepted, as is any other text."""
    body = json.dumps({"inputs": "smile \ud83d\ude00 naïve", "parameters": {"stop": ["\U0001f600"]}})
    assert "\\ud83d\\ude00" in body
    r = httpx.post(queue_service.base_url + "/v1/jobs", content=body.encode(),
                   headers={**auth("alice"), "Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 202, r.text
    httpx.delete(queue_service.base_url + f"/v1/jobs/{r.json()['id']}", headers=auth("alice"), timeout=30)


def test_a_missing_key_is_still_401_first(queue_service) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps({"inputs": HIGH}).encode()
    r = httpx.post(queue_service.base_url + "/generate", content=body,
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 401, r.text


@pytest.mark.parametrize(("body", "field"), [
    ({"a": [1, {"b": ["ok", "x" + LOW]}]}, "a.1.b.1"),
    ({"ok": "fine", "k" + HIGH: 1}, "k\\ud800"),
    (HIGH, None),
    ({"a": "ok", "b": [True, None, 1.5]}, ""),
])
def test_the_check_walks_keys_and_nesting(body: Any, field: str | None) -> None:
    error = unpaired_surrogate(body)
    if field == "":
        assert error is None
        return
    assert error is not None and error.param == field
    error.message.encode("utf-8")  # the message itself is sendable: a surrogate in a key is escaped


def test_the_check_survives_deep_nesting() -> None:
    body: Any = "x" + HIGH
    for _ in range(5_000):
        body = [body]
    error = unpaired_surrogate(body)
    assert error is not None and error.param == ".".join(["0"] * 5_000)
