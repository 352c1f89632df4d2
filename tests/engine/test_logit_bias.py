"""OpenAI's logit_bias in the batched sampler: added per row before penalties and temperature; rows
without a bias are untouched, and a batch with none pays nothing."""

from __future__ import annotations

import pytest
import torch

import conveyor.engine.sampler as sampler_module
from conveyor.engine.sampler import Sampler
from tests.engine.test_sampler import logits_for, seq


def test_plus_100_makes_greedy_pick_the_token_and_minus_100_bans_it() -> None:
    logits = logits_for(3, 300, scale=3.0)
    greedy = logits.argmax(-1).tolist()
    low = int(logits[0].argmin())
    seqs = [seq([1], logit_bias=((low, 100.0),)),
            seq([1], logit_bias=((greedy[1], -100.0),)),
            seq([1])]
    out = Sampler().sample(logits, seqs)
    assert out.token_ids[0] == low
    second = logits[1].clone()
    second[greedy[1]] = float("-inf")
    assert out.token_ids[1] == int(second.argmax()) != greedy[1]
    assert out.token_ids[2] == greedy[2]  # a row without a bias is as before


def test_bias_shifts_logprobs_and_sampled_rows_never_draw_a_banned_token() -> None:
    logits = logits_for(1, 50, scale=0.1)  # nearly flat: every token is likely without the bias
    banned = tuple((t, -100.0) for t in range(0, 50, 2))
    drawn = set()
    for i in range(200):
        s = seq([1], do_sample=True, seed=i, logit_bias=banned)
        drawn.add(Sampler().sample(logits, [s]).token_ids[0])
    assert drawn and all(t % 2 == 1 for t in drawn)
    out = Sampler().sample(logits, [seq([1], top_n_tokens=1, logit_bias=((7, 5.0),))])
    biased = logits.clone()
    biased[0, 7] += 5.0
    assert out.top_tokens[0][0][0] == 7
    assert out.logprobs[0] == pytest.approx(float(torch.log_softmax(biased, -1)[0, 7]), abs=1e-6)


def test_logits_unmodified_and_a_batch_without_bias_adds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    logits = logits_for(2, 100)
    before = logits.clone()
    Sampler().sample(logits, [seq([1], logit_bias=((3, 50.0),)), seq([1])])
    assert torch.equal(logits, before)
    calls = []
    real = torch.Tensor.index_add_
    monkeypatch.setattr(torch.Tensor, "index_add_", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert sampler_module._apply_logit_bias(logits, [seq([1]), seq([1])]) is logits
    Sampler().sample(logits, [seq([1]), seq([1])])
    assert calls == []
