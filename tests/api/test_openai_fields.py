"""OpenAI fields against the real api + worker (tiny model): `null` as "not given", logit_bias,
several prompts per completion, chat stream deltas, completion logprobs that match the text (prompt
logprobs: tests/api/test_prompt_logprobs.py)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from conveyor.wire.openai import ChatCompletionRequest, CompletionRequest
from tests.api.conftest import auth, until
from tests.api.sse import events

MSG = [{"role": "user", "content": "Name a colour."}]
GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}


def post(service, route: str, body: dict) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.post(service.base_url + route, json=body, headers=auth("alice"), timeout=60)


def ok(service, route: str, body: dict) -> dict:  # type: ignore[no-untyped-def]
    r = post(service, route, body)
    assert r.status_code == 200, r.text
    return r.json()


def chunks_of(service, route: str, body: dict) -> list[dict]:  # type: ignore[no-untyped-def]
    with httpx.stream("POST", service.base_url + route, json={**body, "stream": True}, headers=auth("alice"),
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    return [json.loads(line[5:]) for line in lines[:-1]]


REQUIRED = {ChatCompletionRequest: {"messages": MSG}, CompletionRequest: {"prompt": "hi"}}
OPTIONAL = [(model, name) for model in REQUIRED for name, f in model.model_fields.items()
            if not f.is_required()]


@pytest.mark.parametrize(("model", "name"), OPTIONAL, ids=[f"{m.__name__}.{n}" for m, n in OPTIONAL])
def test_every_optional_field_takes_null_as_not_given(model, name: str) -> None:  # type: ignore[no-untyped-def]
    given = model.model_validate({**REQUIRED[model], name: None})
    assert given == model.model_validate(REQUIRED[model])


def test_text_generation_clients_nulls_are_accepted(tiny_service) -> None:  # type: ignore[no-untyped-def]
    """What `text_generation.Client.chat` sends, and every other optional field null at once."""
    nulls = {name: None for model, name in OPTIONAL if model is ChatCompletionRequest}
    body = ok(tiny_service, "/v1/chat/completions", {**nulls, "messages": MSG, "max_tokens": 3})
    assert body["choices"][0]["message"]["role"] == "assistant" and body["usage"]["completion_tokens"] <= 3
    nulls = {name: None for model, name in OPTIONAL if model is CompletionRequest}
    body = ok(tiny_service, "/v1/completions", {**nulls, "prompt": "hi"})
    assert body["usage"]["completion_tokens"] <= 16  # max_tokens null: OpenAI's default, 16


def test_top_logprobs_up_to_20(tiny_service) -> None:  # type: ignore[no-untyped-def]
    body = ok(tiny_service, "/v1/chat/completions",
              {"messages": MSG, **GREEDY, "logprobs": True, "top_logprobs": 20})
    content = body["choices"][0]["logprobs"]["content"]
    assert content and all(len(t["top_logprobs"]) == 20 for t in content)


def job_tokens(service, body: dict) -> list[int]:  # type: ignore[no-untyped-def]
    """The token ids an async completion job generated (its events carry them)."""
    r = post(service, "/v1/jobs", body)
    assert r.status_code == 202, r.text
    url = service.base_url + f"/v1/jobs/{r.json()['id']}/events"
    with httpx.stream("GET", url, headers=auth("alice"), timeout=60) as response:
        return [data["token"]["id"] for _, data in events(response) if data.get("token")]


def test_logit_bias_plus_100_is_always_chosen_and_minus_100_never(tiny_service) -> None:  # type: ignore[no-untyped-def]
    body = {"prompt": "Once upon a time", **GREEDY}
    plain = job_tokens(tiny_service, body)
    assert len(plain) == 6
    target = next(t for t in range(300, 400) if t not in plain)
    assert job_tokens(tiny_service, {**body, "logit_bias": {str(target): 100}}) == [target] * 6
    banned = job_tokens(tiny_service, {**body, "logit_bias": {str(plain[0]): -100}})
    assert plain[0] not in banned and banned[0] != plain[0]
    banned = job_tokens(tiny_service, {**body, "logit_bias": {str(t): -100 for t in set(plain)}})
    assert not set(plain) & set(banned)
    # the same bias through the sync routes: the text is the forced token's, six times over
    forced = ok(tiny_service, "/v1/completions", {**body, "logit_bias": {str(target): 100}, "logprobs": 0})
    chat = ok(tiny_service, "/v1/chat/completions",
              {"messages": MSG, **GREEDY, "logit_bias": {str(target): 100}})
    [piece] = set(forced["choices"][0]["logprobs"]["tokens"])
    assert forced["choices"][0]["text"] == piece * 6 == chat["choices"][0]["message"]["content"]


def test_several_prompts_one_job_each_indexed_summed(tiny_service) -> None:  # type: ignore[no-untyped-def]
    prompts = ["Once upon a time", "The capital of France", "Hello"]
    alone = [ok(tiny_service, "/v1/completions", {"prompt": p, **GREEDY}) for p in prompts]
    r = post(tiny_service, "/v1/completions", {"prompt": prompts, **GREEDY})
    assert r.status_code == 200, r.text
    assert len(r.headers["X-Job-Id"].split(",")) == 3
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == [a["choices"][0]["text"] for a in alone]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert body["usage"][key] == sum(a["usage"][key] for a in alone)
    ids = ok(tiny_service, "/v1/completions", {"prompt": [[5, 6, 7], [8, 9]], **GREEDY})
    assert [c["index"] for c in ids["choices"]] == [0, 1] and ids["usage"]["prompt_tokens"] == 5

    chunks = chunks_of(tiny_service, "/v1/completions", {"prompt": prompts, **GREEDY,
                                                         "stream_options": {"include_usage": True}})
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"] == body["usage"]
    texts = {i: "".join(c["choices"][0]["text"] for c in chunks[:-1] if c["choices"][0]["index"] == i)
             for i in range(3)}
    assert texts == {i: c["text"] for i, c in enumerate(body["choices"])}
    finished = [c["choices"][0]["index"] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1, 2]


def test_official_client_with_several_prompts(tiny_service) -> None:  # type: ignore[no-untyped-def]
    c = openai.OpenAI(base_url=tiny_service.base_url + "/v1", api_key="key-alice", max_retries=0, timeout=60)
    whole = c.completions.create(model="tiny", prompt=["a b c", "d e f"], max_tokens=3, temperature=0)
    assert [ch.index for ch in whole.choices] == [0, 1]


def test_chat_stream_names_the_role_in_every_delta(tiny_service) -> None:  # type: ignore[no-untyped-def]
    """As TGI: OpenAI's client accepts it, TGI's own (text-generation) requires it."""
    chunks = chunks_of(tiny_service, "/v1/chat/completions", {"messages": MSG, **GREEDY})
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert all(d["role"] == "assistant" for d in deltas) and len(deltas) == 6


def test_tgi_client_streams_a_chat(tiny_service) -> None:  # type: ignore[no-untyped-def]
    from text_generation import Client

    client = Client(tiny_service.base_url, headers=auth("alice"), timeout=60)
    chunks = []
    # Read up to the finish: the client cannot parse the `data: [DONE]` that ends the stream.
    for chunk in client.chat(messages=MSG, max_tokens=6, temperature=0, stream=True):
        chunks.append(chunk)
        if chunk.choices[0].finish_reason:
            break
    assert all(c.choices[0].delta.role == "assistant" for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    whole = client.chat(messages=MSG, max_tokens=6, temperature=0)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content


def test_continuous_usage_stats_count_the_tokens_so_far(tiny_service) -> None:  # type: ignore[no-untyped-def]
    """vLLM's extension (guidellm sends it): with include_usage, every chunk carries the usage so far."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    for route, body in (("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": "hi"})):
        *deltas, last = chunks_of(tiny_service, route, {**body, **GREEDY, "stream_options": options})
        assert [c["usage"]["completion_tokens"] for c in deltas] == list(range(1, 7))
        prompt = last["usage"]["prompt_tokens"]
        assert all(c["usage"]["prompt_tokens"] == prompt and c["usage"]["total_tokens"] == prompt + i + 1
                   for i, c in enumerate(deltas))
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
        plain = chunks_of(tiny_service, route, {**body, **GREEDY, "stream_options": {"include_usage": True}})
        assert all(c["usage"] is None for c in plain[:-1])


def test_stream_options_without_stream_is_refused(tiny_service) -> None:  # type: ignore[no-untyped-def]
    for route, body in (("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": "hi"})):
        r = post(tiny_service, route, {**body, "stream_options": {"include_usage": True}})
        assert r.status_code == 422 and r.json()["error"]["param"] == "stream_options", r.text
        assert "only allowed when `stream` is true" in r.json()["error"]["message"]


def test_completion_logprobs_match_the_text_when_a_stop_sequence_ends_it(tiny_service) -> None:  # type: ignore[no-untyped-def]
    body = {"prompt": "Once upon a time", **GREEDY, "max_tokens": 12, "logprobs": 1}
    whole = ok(tiny_service, "/v1/completions", body)["choices"][0]
    tokens = whole["logprobs"]["tokens"]
    offsets = whole["logprobs"]["text_offset"]
    # A whole token as the stop sequence: the token completing it shows no text of its own (the
    # case that left an empty entry).
    i = next(i for i in range(1, len(tokens)) if tokens[i] and whole["text"].find(tokens[i]) == offsets[i])
    stop = tokens[i]
    cut = offsets[i]
    stopped = ok(tiny_service, "/v1/completions", {**body, "stop": [stop]})
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == whole["text"][:cut]
    lp = choice["logprobs"]
    assert "" not in lp["tokens"] and "".join(lp["tokens"]) == choice["text"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    assert stopped["usage"]["completion_tokens"] >= len(lp["tokens"])  # the completing token is counted


def test_each_prompt_is_admitted_and_a_refused_one_leaves_no_job(queue_service) -> None:  # type: ignore[no-untyped-def]
    """The tenant cap is 3 jobs: four prompts are refused (429), and the three already queued are
    cancelled, freeing their places."""
    headers = auth("erin")
    r = httpx.post(queue_service.base_url + "/v1/completions", headers=headers, timeout=30,
                   json={"prompt": ["a", "b", "c", "d"], "max_tokens": 2})
    assert r.status_code == 429 and "Retry-After" in r.headers, r.text

    def ended() -> list[dict] | None:
        jobs = httpx.get(queue_service.base_url + "/v1/jobs", headers=headers, timeout=30).json()["data"]
        return jobs if len(jobs) == 3 and all(j["status"] == "cancelled" for j in jobs) else None

    until(ended, "the three admitted jobs of a refused request are cancelled", timeout=120)
    with httpx.stream("POST", queue_service.base_url + "/v1/completions", headers=headers, timeout=30,
                      json={"prompt": ["a", "b", "c"], "max_tokens": 2, "stream": True}) as s:
        assert s.status_code == 200, s.read()  # three places again (the jobs stay queued: no worker)
        job_ids = s.headers["X-Job-Id"].split(",")
    assert len(job_ids) == 3
    for job_id in job_ids:  # the stream closed: its jobs are cancelled
        until(lambda job_id=job_id: httpx.get(f"{queue_service.base_url}/v1/jobs/{job_id}", headers=headers,
                                              timeout=30).json()["status"] == "cancelled",
              "a closed stream's jobs are cancelled", timeout=120)


def test_a_chat_without_max_tokens_may_use_the_rest_of_the_context(tiny_service) -> None:  # type: ignore[no-untyped-def]
    """As OpenAI and vLLM (agent frameworks rarely send max_tokens): not the 100 of TGI's default."""
    long = [{"role": "user", "content": "word " * 3800}]
    body = ok(tiny_service, "/v1/chat/completions", {"messages": long, "temperature": 0, "ignore_eos": True})
    usage = body["usage"]
    assert body["choices"][0]["finish_reason"] == "length" and usage["completion_tokens"] > 100
    info = httpx.get(tiny_service.base_url + "/v1/models", headers=auth("alice"), timeout=60).json()
    assert usage["total_tokens"] == info["data"][0]["max_model_len"]
