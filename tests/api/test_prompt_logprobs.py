"""Prompt logprobs through the real api and worker (tiny model), against a plain Hugging Face forward
of the same model: TGI `decoder_input_details`, OpenAI completions `echo` + `logprobs` (sync, streamed,
scoring only with `max_tokens` 0) and an async job's first event."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from tests.api.conftest import auth
from tests.api.test_async_jobs import read_events, submit, wait_status
from tests.api.test_openai_fields import ok, post

PROMPT = "The quick brown fox jumps over the lazy dog because"
TOL = 1e-4


@pytest.fixture(scope="module")
def hf_logprobs(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    """ids -> each token's logprob given the ones before it (the first: None), by a plain forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()

    def run(ids: list[int]) -> list[float | None]:
        with torch.inference_mode():
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        return [None, *logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()]

    return run


@pytest.fixture(scope="module")
def prompt_ids(tiny_model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)(PROMPT)["input_ids"]


def close(got: list[float | None], want: list[float | None]) -> bool:
    return len(got) == len(want) and got[0] is None and want[0] is None and all(
        abs(g - w) <= TOL for g, w in zip(got[1:], want[1:], strict=True))  # type: ignore[operator]


def test_tgi_decoder_input_details_prefill(tiny_service, hf_logprobs) -> None:  # type: ignore[no-untyped-def]
    body = ok(tiny_service, "/generate", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 3, "details": True, "decoder_input_details": True}})
    prefill = body["details"]["prefill"]
    assert len(prefill) > 5 and all(set(t) == {"id", "text", "logprob"} for t in prefill)
    assert close([t["logprob"] for t in prefill], hf_logprobs([t["id"] for t in prefill]))
    assert len(body["details"]["tokens"]) == 3
    plain = ok(tiny_service, "/generate",
               {"inputs": PROMPT, "parameters": {"max_new_tokens": 3, "details": True}})
    assert plain["details"]["prefill"] == []


def test_tgi_stream_refuses_decoder_input_details_as_tgi(tiny_service) -> None:  # type: ignore[no-untyped-def]
    r = post(tiny_service, "/generate_stream",
             {"inputs": PROMPT, "parameters": {"decoder_input_details": True}})
    assert r.status_code == 422 and "decoder_input_details" in r.json()["error"], r.text


def check_echo(choice: dict, prompt_ids: list[int], hf_logprobs, generated: int) -> None:  # type: ignore[no-untyped-def]
    lp, n = choice["logprobs"], len(prompt_ids)
    assert choice["text"].startswith(PROMPT)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n + generated
    assert "".join(lp["tokens"][:n]) == PROMPT
    assert close(lp["token_logprobs"][:n], hf_logprobs(prompt_ids))
    assert lp["top_logprobs"][0] is None
    for token, logprob, top in zip(lp["tokens"][1:n], lp["token_logprobs"][1:n], lp["top_logprobs"][1:n],
                                   strict=True):
        assert top[token] == logprob and len(top) in (2, 3)  # the top 2 and the token itself
    offsets = lp["text_offset"]
    assert offsets[:n] == [len("".join(lp["tokens"][:i])) for i in range(n)]
    assert offsets[n:] == [len(PROMPT) + len("".join(lp["tokens"][n:i])) for i in range(n, n + generated)]


def test_completions_echo_logprobs(tiny_service, prompt_ids, hf_logprobs) -> None:  # type: ignore[no-untyped-def]
    body = {"prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 2, "temperature": 0,
            "ignore_eos": True}
    answer = ok(tiny_service, "/v1/completions", body)
    check_echo(answer["choices"][0], prompt_ids, hf_logprobs, generated=2)
    assert answer["usage"]["prompt_tokens"] == len(prompt_ids)
    # Streamed: the first chunk echoes the prompt with its logprobs; the chunks add up to the answer.
    with httpx.stream("POST", tiny_service.base_url + "/v1/completions", json={**body, "stream": True},
                      headers=auth("alice"), timeout=60) as r:
        chunks = [json.loads(line[5:]) for line in r.iter_lines()
                  if line.startswith("data:") and line != "data: [DONE]"]
    choices = [c["choices"][0] for c in chunks]
    assert choices[0]["text"].startswith(PROMPT)
    merged = {k: sum((c["logprobs"][k] for c in choices), []) for k in answer["choices"][0]["logprobs"]}
    assert merged == answer["choices"][0]["logprobs"]
    assert "".join(c["text"] for c in choices) == answer["choices"][0]["text"]


def test_max_tokens_0_with_echo_scores_only(tiny_service, prompt_ids, hf_logprobs) -> None:  # type: ignore[no-untyped-def]
    answer = ok(tiny_service, "/v1/completions",
                {"prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 0})
    choice = answer["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 0
    check_echo(choice, prompt_ids, hf_logprobs, generated=0)
    # lm-evaluation-harness sends token ids and max_tokens 1; several prompts are one job each.
    two = ok(tiny_service, "/v1/completions", {"prompt": [prompt_ids, prompt_ids[:5]], "echo": True,
                                               "logprobs": 1, "max_tokens": 1, "temperature": 0})
    assert [len(c["logprobs"]["tokens"]) for c in two["choices"]] == [len(prompt_ids) + 1, 6]
    assert close(two["choices"][1]["logprobs"]["token_logprobs"][:5], hf_logprobs(prompt_ids[:5]))
    r = post(tiny_service, "/v1/completions", {"prompt": PROMPT, "logprobs": 2, "max_tokens": 0})
    assert r.status_code == 422 and r.json()["error"]["param"] == "max_tokens", r.text


def test_async_job_carries_the_prompt_in_its_first_event(tiny_service, prompt_ids, hf_logprobs) -> None:  # type: ignore[no-untyped-def]
    for body in ({"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 0},
                 {"inputs": PROMPT, "parameters": {"max_new_tokens": 2, "decoder_input_details": True,
                                                   "details": True}}):
        job_id = submit(tiny_service, body).json()["id"]
        assert wait_status(tiny_service, job_id, {"succeeded", "failed"})["status"] == "succeeded"
        events = [e for _id, e in read_events(tiny_service, job_id)]
        prompt = events[0]["prompt"]
        assert events[0]["index"] == 0 and all("prompt" not in e for e in events[1:])
        assert close([t.get("logprob") for t in prompt], hf_logprobs([t["id"] for t in prompt]))
    assert [t["id"] for t in events[0]["prompt"]] != [] and events[-1]["final"]
