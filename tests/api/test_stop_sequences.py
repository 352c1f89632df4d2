"""Stop sequences in each dialect, through the real api + worker (tiny model, greedy): TGI ends
`generated_text` (and the streamed tokens) with the matched stop sequence, as TGI does (its text
is the concatenation of the generated tokens, the one completing the stop included); OpenAI's
`stop` cuts the text right before it."""

from __future__ import annotations

import httpx

from tests.api.conftest import auth
from tests.api.sse import events

PROMPT = "Tell me a story about a robot"


def generate(service, **parameters: object) -> dict:  # type: ignore[no-untyped-def]
    r = httpx.post(service.base_url + "/generate", headers=auth("alice"), timeout=60,
                   json={"inputs": PROMPT,
                         "parameters": {"max_new_tokens": 12, "details": True, **parameters}})
    assert r.status_code == 200, r.text
    return r.json()


def spanning_stop(texts: list[str]) -> tuple[str, int]:
    """A stop sequence that spans two tokens (the end of one, the start of the next), found first
    where it ends; and the index in the joined text where it starts."""
    joined, offset = "".join(texts), 0
    for a, b in zip(texts, texts[1:], strict=False):
        offset += len(a)
        if len(a) >= 2 and len(b) >= 2:
            stop = a[-2:] + b[:2]
            if joined.find(stop) == offset - 2:
                return stop, offset - 2
    raise AssertionError(f"no two tokens of two characters each in {texts}")


def test_tgi_includes_the_stop_sequence_openai_does_not(tiny_service) -> None:  # type: ignore[no-untyped-def]
    whole = generate(tiny_service)
    texts = [t["text"] for t in whole["details"]["tokens"] if not t["special"]]
    stop, at = spanning_stop(texts)
    expected = whole["generated_text"][: at + len(stop)]

    stopped = generate(tiny_service, stop=[stop])
    assert stopped["generated_text"] == expected and expected.endswith(stop)
    assert stopped["details"]["finish_reason"] == "stop_sequence"
    assert "".join(t["text"] for t in stopped["details"]["tokens"]) == expected

    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 12, "stop": [stop]}}
    with httpx.stream("POST", tiny_service.base_url + "/generate_stream", json=body, headers=auth("alice"),
                      timeout=60) as r:
        streamed = [data for _, data in events(r)]
    assert "".join(d["token"]["text"] for d in streamed) == expected == streamed[-1]["generated_text"]
    assert streamed[-1]["details"]["finish_reason"] == "stop_sequence"
    assert streamed[-1]["token"]["text"].endswith(stop[-2:])  # the completing token brings the stop out

    # OpenAI on the same prompt tokens (the ones /generate ran on): the stop is cut off.
    ids = [t["id"] for t in httpx.post(tiny_service.base_url + "/tokenize", json={"inputs": PROMPT},
                                       headers=auth("alice"), timeout=60).json()]
    r = httpx.post(tiny_service.base_url + "/v1/completions", headers=auth("alice"), timeout=60,
                   json={"prompt": ids, "max_tokens": 12, "temperature": 0, "stop": [stop]})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == whole["generated_text"][:at] and choice["finish_reason"] == "stop"


def test_async_generate_job_includes_it_too(tiny_service) -> None:  # type: ignore[no-untyped-def]
    whole = generate(tiny_service)
    texts = [t["text"] for t in whole["details"]["tokens"] if not t["special"]]
    stop, at = spanning_stop(texts)
    r = httpx.post(tiny_service.base_url + "/v1/jobs", headers=auth("alice"), timeout=60,
                   json={"inputs": PROMPT, "parameters": {"max_new_tokens": 12, "stop": [stop]}})
    assert r.status_code == 202, r.text
    url = tiny_service.base_url + f"/v1/jobs/{r.json()['id']}/events"
    with httpx.stream("GET", url, headers=auth("alice"), timeout=60) as response:
        final = [data for _, data in events(response)][-1]
    assert final["result"]["generated_text"] == whole["generated_text"][: at + len(stop)]
