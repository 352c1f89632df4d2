"""Constrained decoding in the batched sampler and the engine: the mask reaches only rows with a
grammar, EOS only where the grammar accepts, a resumed request's matcher continues where it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import conveyor.engine.sampler as sampler_module
from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.grammar import GrammarCompiler, GrammarMatcher
from conveyor.engine.loader import load_tokenizer
from conveyor.engine.params import Grammar, SamplingParams, StoppingParams
from conveyor.engine.sampler import Sampler
from tests.engine.test_sampler import logits_for, seq

DIGITS = Grammar("regex", "[0-9]{1,6}")
# Bounded (an integer range, a boolean): every document ends within the token budget.
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path):  # type: ignore[no-untyped-def]
    return load_tokenizer(default_model_dir)


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:  # type: ignore[no-untyped-def]
    return GrammarCompiler(tokenizer, frozenset({tokenizer.eos_token_id}))


def test_mask_reaches_only_grammar_rows(tokenizer, compiler: GrammarCompiler) -> None:  # type: ignore[no-untyped-def]
    vocab = len(tokenizer)
    logits = logits_for(4, vocab, seed=3)
    seqs = [seq([1]), seq([1], do_sample=True, seed=5, top_p=0.9), seq([1]),
            seq([1], do_sample=True, seed=7, top_k=50, temperature=0.7, repetition_penalty=1.3,
                logit_bias=((int(logits[3].argmax()), 30.0),))]
    plain = Sampler().sample(logits, seqs)
    seqs[1].matcher = compiler.matcher(DIGITS, [])
    seqs[2].matcher = compiler.matcher(DIGITS, [])
    out = Sampler().sample(logits, seqs)
    assert out.token_ids[0] == plain.token_ids[0] and out.token_ids[3] == plain.token_ids[3]
    for row in (1, 2):
        assert tokenizer.decode([out.token_ids[row]]).isdigit()
    assert tokenizer.decode([plain.token_ids[2]]).isdigit() is False  # the mask changed something


def test_no_grammar_row_costs_no_tensor_op(monkeypatch: pytest.MonkeyPatch, tokenizer) -> None:  # type: ignore[no-untyped-def]
    logits = logits_for(2, len(tokenizer))
    calls = []
    monkeypatch.setattr(GrammarMatcher, "allowed", lambda *a: calls.append(1))
    assert sampler_module._apply_grammar(logits, [seq([1]), seq([1], do_sample=True, seed=1)]) is logits
    Sampler().sample(logits, [seq([1]), seq([1], do_sample=True, seed=1)])
    assert calls == []


def test_eos_only_where_the_grammar_accepts(tokenizer, compiler: GrammarCompiler) -> None:  # type: ignore[no-untyped-def]
    eos = tokenizer.eos_token_id
    logits = torch.zeros(1, len(tokenizer))
    logits[0, eos] = 50.0  # EOS is by far the best token
    s = seq([1])
    s.matcher = compiler.matcher(Grammar("regex", "ab"), [])
    first = Sampler().sample(logits, [s]).token_ids[0]
    assert first != eos  # "" does not match: EOS is masked
    for token in tokenizer.encode("ab", add_special_tokens=False):
        s.matcher.advance(token)
    assert Sampler().sample(logits, [s]).token_ids[0] == eos  # "ab" matches: EOS allowed (and forced)


def test_resumed_matcher_equals_one_advanced_token_by_token(tokenizer, compiler: GrammarCompiler) -> None:  # type: ignore[no-untyped-def]
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    prefix = tokenizer.encode('{"n": 12', add_special_tokens=False)
    stepwise = compiler.matcher(grammar, [])
    for token in prefix:
        stepwise.advance(token)
    resumed = compiler.matcher(grammar, prefix)
    vocab = len(tokenizer)
    assert (resumed.allowed(vocab) == stepwise.allowed(vocab)).all()
    assert (resumed.allowed(vocab) != compiler.matcher(grammar, []).allowed(vocab)).any()


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    return Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_cache_memory=64 * 1024**2, device="cpu"))


Requests = dict[str, tuple[SamplingParams, list[int]]]


def run(engine: Engine, requests: Requests, max_new: int = 40) -> dict[str, list[int]]:
    for rid, (sampling, generated) in requests.items():
        engine.add(rid, [1, 2, 3], sampling, StoppingParams(max_new_tokens=max_new), generated=generated)
    tokens: dict[str, list[int]] = {rid: list(g) for rid, (_, g) in requests.items()}
    while engine.has_unfinished():
        for event in engine.step():
            if event.token_id is not None:
                tokens[event.request_id].append(event.token_id)
    return tokens


def test_engine_rows_follow_their_schema_and_a_resume_continues_exactly(engine: Engine) -> None:  # type: ignore[no-untyped-def]
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    eos = engine.eos_token_ids
    requests = {f"s{i}": (SamplingParams(do_sample=True, seed=i, temperature=1.5, top_p=0.95,
                                         frequency_penalty=0.5, grammar=grammar), [])
                for i in range(6)}
    requests["greedy"] = (SamplingParams(grammar=grammar), [])
    requests["free"] = (SamplingParams(do_sample=True, seed=1), [])
    out = run(engine, requests, max_new=60)
    for rid, tokens in out.items():
        if rid == "free":
            continue
        text = engine.tokenizer.decode([t for t in tokens if t not in eos])
        value = json.loads(text)
        assert set(value) == {"n", "ok"} and isinstance(value["n"], int) and isinstance(value["ok"], bool)
    # Resume s0 after 4 of its tokens: the same continuation.
    resumed = run(engine, {"again": (requests["s0"][0], out["s0"][:4])}, max_new=60)
    assert resumed["again"] == out["s0"]
