"""Several choices per request through the real api + worker (tiny model): OpenAI `n` (sync and
streamed: indices, a finish per choice, usage over all), OpenAI and TGI `best_of`, their 422s, and
the cancel of a multi-choice job (every block back)."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import TERMINAL, auth, blocks_used, until
from tests.api.test_async_jobs import read_events, submit, wait_status
from tests.api.test_openai_fields import chunks_of, ok, post

MSG = [{"role": "user", "content": "Name a colour."}]
SAMPLED = {"temperature": 1.0, "seed": 7, "max_tokens": 6, "ignore_eos": True}


def test_completion_n3_sync(tiny_service) -> None:  # type: ignore[no-untyped-def]
    body = {"prompt": "Once upon a time", "n": 3, "logprobs": 1, **SAMPLED}
    got = ok(tiny_service, "/v1/completions", body)
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in got["choices"])
    assert len({c["text"] for c in got["choices"]}) == 3  # each choice samples its own tokens
    for c in got["choices"]:
        assert "".join(c["logprobs"]["tokens"]) == c["text"]  # each choice's own logprobs
    assert got["usage"]["completion_tokens"] == 3 * 6
    assert got["usage"]["total_tokens"] == got["usage"]["prompt_tokens"] + 18
    # Seeded: the same again; choice 0 is what the request with n=1 gives.
    assert ok(tiny_service, "/v1/completions", body)["choices"] == got["choices"]
    one = ok(tiny_service, "/v1/completions", {**body, "n": 1})
    assert one["choices"][0]["text"] == got["choices"][0]["text"]


def test_chat_n3_stream(tiny_service) -> None:  # type: ignore[no-untyped-def]
    body = {"messages": MSG, "n": 3, "stream_options": {"include_usage": True}, **SAMPLED}
    chunks = chunks_of(tiny_service, "/v1/chat/completions", body)
    *deltas, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 18
    texts: dict[int, str] = {}
    finishes: dict[int, list[str]] = {}
    for chunk in deltas:
        [choice] = chunk["choices"]
        i = choice["index"]
        texts[i] = texts.get(i, "") + (choice["delta"].get("content") or "")
        assert choice["delta"]["role"] == "assistant"  # in every delta, as TGI
        if choice["finish_reason"] is not None:
            finishes.setdefault(i, []).append(choice["finish_reason"])
    assert sorted(texts) == [0, 1, 2]
    assert finishes == {0: ["length"], 1: ["length"], 2: ["length"]}  # one finish chunk per choice
    sync = ok(tiny_service, "/v1/chat/completions", {k: v for k, v in body.items() if k != "stream_options"})
    assert {c["index"]: c["message"]["content"] for c in sync["choices"]} == texts


def test_completion_best_of_returns_the_best_by_cumulative_logprob(tiny_service) -> None:  # type: ignore[no-untyped-def]
    body = {"prompt": "Once upon a time", "logprobs": 0, **SAMPLED}
    every = ok(tiny_service, "/v1/completions", {**body, "n": 3})["choices"]
    scores = {c["text"]: sum(c["logprobs"]["token_logprobs"]) for c in every}
    got = ok(tiny_service, "/v1/completions", {**body, "n": 2, "best_of": 3})
    assert [c["index"] for c in got["choices"]] == [0, 1]
    best_two = sorted(scores, key=lambda t: -scores[t])[:2]
    assert [c["text"] for c in got["choices"]] == best_two
    assert got["usage"]["completion_tokens"] == 3 * 6  # all best_of sequences count


def test_tgi_best_of_with_best_of_sequences(tiny_service) -> None:  # type: ignore[no-untyped-def]
    params = {"best_of": 2, "do_sample": True, "max_new_tokens": 5, "details": True}
    r = post(tiny_service, "/generate", {"inputs": "Hello", "parameters": params})
    assert r.status_code == 200, r.text
    got = r.json()
    details = got["details"]
    [other] = details["best_of_sequences"]
    assert set(other) >= {"generated_text", "finish_reason", "generated_tokens", "seed", "prefill", "tokens"}
    assert other["generated_tokens"] == len(other["tokens"]) == 5 and other["finish_reason"] == "length"
    assert details["seed"] is not None and other["seed"] is not None and other["seed"] != details["seed"]

    def mean(tokens: list[dict]) -> float:
        return sum(t["logprob"] for t in tokens) / len(tokens)

    assert mean(details["tokens"]) >= mean(other["tokens"])  # TGI's pick: the best mean logprob
    assert got["generated_text"] == "".join(t["text"] for t in details["tokens"] if not t["special"])


@pytest.mark.parametrize(("route", "body", "param", "words"), [
    ("/v1/completions", {"prompt": "a", "n": 5}, "n", "`n` must be <= 4"),
    ("/v1/completions", {"prompt": "a", "n": 3, "best_of": 2}, "best_of", "`best_of` must be >= `n`"),
    ("/v1/completions", {"prompt": "a", "best_of": 5}, "best_of", "`best_of` must be <= 4"),
    ("/v1/completions", {"prompt": "a", "best_of": 2, "stream": True}, "best_of",
     "not supported when streaming"),
    ("/v1/chat/completions", {"messages": MSG, "n": 9}, "n", "`n` must be <= 4"),
])
def test_openai_refusals(tiny_service, route: str, body: dict, param: str, words: str) -> None:  # type: ignore[no-untyped-def]
    r = post(tiny_service, route, body)
    assert r.status_code in (400, 422), r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


@pytest.mark.parametrize(("route", "params", "words"), [
    ("/generate", {"best_of": 5, "do_sample": True}, "`best_of` must be > 0 and <= 4. Given: 5"),
    ("/generate", {"best_of": 2}, "you must use sampling when `best_of` is > 1"),
    ("/generate", {"best_of": 2, "do_sample": True, "seed": 1}, "`seed` must not be set when `best_of` > 1"),
    ("/generate_stream", {"best_of": 2, "do_sample": True}, "`best_of` != 1 is not supported when streaming"),
])
def test_tgi_refusals(tiny_service, route: str, params: dict, words: str) -> None:  # type: ignore[no-untyped-def]
    r = post(tiny_service, route, {"inputs": "Hello", "parameters": params})
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "validation" and words in r.json()["error"], r.json()


def test_async_job_returns_every_choice(tiny_service) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(tiny_service, {"prompt": "Once upon a time", "n": 2, **SAMPLED}).json()["id"]
    job = wait_status(tiny_service, job_id, TERMINAL)
    assert job["status"] == "succeeded", job
    result = job["result"]
    assert [c["index"] for c in result["choices"]] == [0, 1]
    assert result["usage"]["completion_tokens"] == 12
    stream = [data for _id, data in read_events(tiny_service, job_id)]
    assert [e["index"] for e in stream] == list(range(12))  # one stream, numbered across choices
    for c in result["choices"]:
        mine = [e for e in stream if e["choice"] == c["index"]]
        assert len(mine) == 6 and mine[-1]["choice_end"]["index"] == c["index"]
        assert "".join(e["token"]["text"] for e in mine) == c["generated_text"]
    assert stream[-1]["final"]


def test_cancel_of_a_multi_choice_job(tiny_service) -> None:  # type: ignore[no-untyped-def]
    body = {"prompt": "Count forever", "n": 3, "max_tokens": 1500, "ignore_eos": True, "temperature": 1.0}
    job_id = submit(tiny_service, body).json()["id"]
    read_events(tiny_service, job_id, stop_after=6)  # all three are generating
    r = httpx.delete(tiny_service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=30)
    assert r.status_code in (200, 202), r.text
    job = wait_status(tiny_service, job_id, TERMINAL)
    assert job["status"] == "cancelled", job
    choices = job["result"]["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert all(c["finish_reason"] == "cancelled" and c["completion_tokens"] < 1500 for c in choices)
    until(lambda: blocks_used(tiny_service) == 0, "the worker freed every choice's KV blocks")


def test_every_sequence_counts_against_the_batch_token_budget() -> None:
    from conveyor.api.errors import ValidationError
    from conveyor.api.requests.choices import check_tokens
    from conveyor.settings import Settings

    settings = Settings(max_batch_total_tokens=1000)
    check_tokens(settings, 3, 100, 300, "n", "max_tokens")  # 100 + 3 × 300 = 1000: fits
    with pytest.raises(ValidationError, match=r"100 \+ 3 × 301 = 1003") as refused:
        check_tokens(settings, 3, 100, 301, "n", "max_tokens")
    assert refused.value.param == "n"
    check_tokens(Settings(), 4, 100, 4000, "n", "max_tokens")  # no budget set: the KV cache bounds it


def test_the_openai_client_reads_n_choices(tiny_service) -> None:  # type: ignore[no-untyped-def]
    from tests.api.test_openai_clients import client as openai_client

    client = openai_client(tiny_service)
    options = {"temperature": 1.0, "seed": 7, "max_tokens": 6, "extra_body": {"ignore_eos": True}}
    got = client.chat.completions.create(model="m", messages=MSG, n=2, **options)  # type: ignore[arg-type]
    assert [c.index for c in got.choices] == [0, 1] and got.usage is not None
    assert got.usage.completion_tokens == 12
    streamed: dict[int, str] = {}
    for chunk in client.chat.completions.create(model="m", messages=MSG, n=2, stream=True,  # type: ignore[call-overload]
                                                **options):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    assert streamed == {c.index: c.message.content for c in got.choices}
