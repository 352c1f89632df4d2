"""`generate_prompt_format` (docs/api/tgi.md, Prompt format): with `auto` (the default) TGI `inputs`
without special tokens go through the model's chat template as one user message and templated inputs are left
alone; with `raw` nothing is templated. What the model sees is read back from the job record's
spec (exact token ids) and from the stream's `details.input_length`; the expected prompts come
from transformers' own chat-template renderer, not from the api's code."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from conveyor.wire.job import RecordField
from tests.api.conftest import auth, keys_of, redis_of
from tests.api.sse import events

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def templated(tiny_model_dir: Path) -> str:
    """QUESTION as one user message through the model's chat template, ready for the answer."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)
    text = hf.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                  add_generation_prompt=True)
    assert "<|im_start|>" in text and QUESTION in text  # a chat prompt, not the question alone
    return text


def prompt_ids(service, inputs: str) -> list[int]:  # type: ignore[no-untyped-def]
    """The token ids the job of a TGI body with these `inputs` carries to the worker."""
    body = {"inputs": inputs, "parameters": {"max_new_tokens": 2}}
    r = httpx.post(service.base_url + "/v1/jobs", json=body, headers=auth("alice"), timeout=30)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    with redis_of(service) as redis:
        spec = json.loads(redis.hget(keys_of(service).job(job_id), RecordField.SPEC))
    httpx.delete(service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=30)
    return spec["prompt_ids"]


def test_auto_sends_plain_inputs_through_the_chat_template(queue_service, tokenizer, templated) -> None:  # type: ignore[no-untyped-def]
    ids = prompt_ids(queue_service, QUESTION)
    assert ids == tokenizer.encode(templated).ids
    assert ids != tokenizer.encode(QUESTION).ids


def test_auto_leaves_templated_inputs_alone(queue_service, tokenizer, templated) -> None:  # type: ignore[no-untyped-def]
    assert prompt_ids(queue_service, templated) == tokenizer.encode(templated).ids  # not templated twice


def test_raw_never_templates(knobs_service, tokenizer, templated) -> None:  # type: ignore[no-untyped-def]
    assert knobs_service.env["CONVEYOR_GENERATE_PROMPT_FORMAT"] == "raw"
    assert prompt_ids(knobs_service, QUESTION) == tokenizer.encode(QUESTION).ids
    assert prompt_ids(knobs_service, templated) == tokenizer.encode(templated).ids


def test_auto_input_length_counts_the_templated_prompt(tiny_service, tokenizer, templated) -> None:  # type: ignore[no-untyped-def]
    body = {"inputs": QUESTION, "parameters": {"max_new_tokens": 2}}
    with httpx.stream("POST", tiny_service.base_url + "/generate_stream", json=body, headers=auth("alice"),
                      timeout=60) as r:
        assert r.status_code == 200
        *_, (_, last) = list(events(r))
    assert last["details"]["input_length"] == len(tokenizer.encode(templated).ids)
