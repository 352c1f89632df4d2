from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

import conveyor.engine.sampler as sampler_module
from conveyor.engine.params import SamplingParams
from conveyor.engine.sampler import Sampler
from conveyor.engine.sequence import Sequence


def seq(prompt: list[int], generated: tuple[int, ...] | list[int] = (), **sampling: object) -> Sequence:
    s = Sequence(request_id="r", prompt_ids=list(prompt), sampling=SamplingParams(**sampling))
    s.token_ids.extend(generated)
    return s


def logits_for(n: int, vocab: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def all_logprobs(logits: torch.Tensor, *seqs: Sequence) -> torch.Tensor:
    """The sampler's logprob of every token of every row, read back through top-n = vocab."""
    vocab = logits.shape[1]
    for s in seqs:
        s.sampling = replace(s.sampling, top_n_tokens=vocab)
    out = Sampler().sample(logits, list(seqs))
    values = torch.empty(len(seqs), vocab)
    for row, top in enumerate(out.top_tokens):
        for token_id, logprob in top:
            values[row, token_id] = logprob
    return values


def test_greedy_is_argmax_with_logprob() -> None:
    logits = logits_for(5, 300)
    seqs = [seq([1, 2]) for _ in range(4)] + [seq([1], do_sample=True, top_k=1, temperature=0.5)]
    out = Sampler().sample(logits, seqs)
    assert out.token_ids == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).gather(1, logits.argmax(-1, keepdim=True))[:, 0]
    assert out.logprobs == pytest.approx(expected.tolist(), abs=1e-6)
    assert out.top_tokens == [[]] * 5


def test_greedy_does_not_modify_logits_and_breaks_ties_like_torch() -> None:
    logits = torch.zeros(2, 10)
    logits[0, [3, 7]] = 1.0
    before = logits.clone()
    assert Sampler().sample(logits, [seq([1]), seq([1])]).token_ids == [3, 0]
    assert torch.equal(logits, before)


def test_repetition_penalty_matches_transformers_per_row() -> None:
    logits = logits_for(3, 64)
    seqs = [
        seq([3, 5, 5, 9], generated=[9, 11, 40], repetition_penalty=1.3),
        seq([3, 5, 5, 9], generated=[9, 11, 40]),
        seq([1, 2, 3, 60], generated=[63, 0], repetition_penalty=0.8),
    ]
    expected = logits.clone()
    for row in (0, 2):
        processor = RepetitionPenaltyLogitsProcessor(seqs[row].sampling.repetition_penalty)
        expected[row] = processor(torch.tensor([seqs[row].token_ids]), logits[row : row + 1].clone())[0]
    assert torch.allclose(all_logprobs(logits, *seqs), torch.log_softmax(expected, -1), atol=1e-6)


def test_frequency_and_presence_penalties_count_generated_tokens_only() -> None:
    logits = logits_for(1, 64)
    s = seq([3, 4], generated=[4, 7, 7, 7, 20], frequency_penalty=0.5, presence_penalty=0.25)
    expected = logits[0].clone()
    for token_id, count in Counter(s.generated_ids).items():
        expected[token_id] -= 0.5 * count + 0.25
    assert torch.allclose(all_logprobs(logits, s)[0], torch.log_softmax(expected, -1), atol=1e-6)


def test_all_penalties_combined_and_greedy_follows_them() -> None:
    logits = torch.zeros(1, 16)
    logits[0, 2] = 2.0
    logits[0, 6] = 1.5
    s = seq([2], generated=[2], repetition_penalty=1.2, frequency_penalty=0.5)
    expected = logits[0].clone()
    expected[2] = 2.0 / 1.2 - 0.5
    assert torch.allclose(all_logprobs(logits, s)[0], torch.log_softmax(expected, -1), atol=1e-6)
    assert Sampler().sample(logits, [s]).token_ids == [6]


def test_sampled_logprob_is_after_temperature_before_truncation() -> None:
    logits = logits_for(1, 100)
    s = seq([1], do_sample=True, temperature=0.7, top_k=5, seed=3)
    out = Sampler().sample(logits, [s])
    expected = torch.log_softmax(logits / 0.7, -1)[0, out.token_ids[0]]
    assert out.logprobs[0] == pytest.approx(expected.item(), abs=1e-6)


def test_top_n_tokens_are_the_best_with_their_logprobs() -> None:
    logits = logits_for(3, 200)
    seqs = [seq([1], top_n_tokens=5), seq([1]), seq([1], do_sample=True, seed=1, top_n_tokens=2)]
    out = Sampler().sample(logits, seqs)
    expected = torch.log_softmax(logits, -1).topk(5)
    assert [i for i, _ in out.top_tokens[0]] == expected.indices[0].tolist()
    assert [v for _, v in out.top_tokens[0]] == pytest.approx(expected.values[0].tolist(), abs=1e-6)
    assert out.top_tokens[1] == []
    assert [i for i, _ in out.top_tokens[2]] == expected.indices[2, :2].tolist()


@pytest.mark.parametrize("peak", [0.0, 12.0])  # flat: top-p/typical rank all; peaked: a few candidates
def test_seeded_token_is_the_same_alone_or_anywhere_in_any_batch(peak: float) -> None:
    vocab = 49152  # the real size: reductions over it could be split across threads
    target = seq([5, 6], generated=[7], do_sample=True, temperature=0.9, top_p=0.9, typical_p=0.95, seed=42)
    row = logits_for(1, vocab, seed=1)
    row[0, :20] += peak
    alone = Sampler().sample(row, [target])
    others = [
        seq([1]),
        seq([1, 2], generated=[3], do_sample=True, seed=7, top_k=20, repetition_penalty=1.5),
        seq([4], do_sample=True, seed=9, temperature=1.3, frequency_penalty=1.0, top_n_tokens=3),
    ]
    for position in range(len(others) + 1):
        batch = others[:position] + [target] + others[position:]
        logits = logits_for(len(batch), vocab, seed=2)
        logits[position] = row[0]
        out = Sampler().sample(logits, batch)
        assert out.token_ids[position] == alone.token_ids[0]
        assert out.logprobs[position] == alone.logprobs[0]


def test_seeds_and_indices_give_different_draws() -> None:
    logits = torch.zeros(1, 1000)  # uniform: draws are as spread as the seeds make them
    by_seed = {Sampler().sample(logits, [seq([1], do_sample=True, seed=s)]).token_ids[0] for s in range(200)}
    assert len(by_seed) > 150
    by_index = {
        Sampler().sample(logits, [seq([1], generated=[0] * i, do_sample=True, seed=5)]).token_ids[0]
        for i in range(200)
    }
    assert len(by_index) > 150


def hf_kept(logits: torch.Tensor, top_k: int, top_p: float, typical_p: float, temperature: float) -> set[int]:
    scores = logits / temperature
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    if typical_p < 1.0:
        scores = TypicalLogitsWarper(typical_p)(None, scores)
    return set(torch.nonzero(scores[0] > float("-inf"))[:, 0].tolist())


@pytest.mark.parametrize(
    ("top_k", "top_p", "typical_p", "temperature"),
    [(6, 1.0, 1.0, 1.0), (0, 0.8, 1.0, 1.0), (0, 1.0, 0.7, 1.0), (10, 0.9, 0.9, 0.8), (0, 0.0, 1.0, 1.0)],
)
def test_truncation_never_picks_a_filtered_token_and_matches_the_distribution(
    top_k: int, top_p: float, typical_p: float, temperature: float
) -> None:
    draws = 4000
    logits = logits_for(1, 40, seed=11, scale=1.5)
    kept = hf_kept(logits, top_k, top_p, typical_p, temperature)
    params = {"top_k": top_k, "top_p": top_p, "typical_p": typical_p, "temperature": temperature}
    seqs = [seq([1], do_sample=True, seed=s, **params) for s in range(draws)]
    counts = Counter(Sampler().sample(logits.expand(draws, -1).contiguous(), seqs).token_ids)
    assert set(counts) <= kept
    probs = torch.softmax(logits[0] / temperature, -1)
    mass = sum(probs[i].item() for i in kept)
    for token_id in kept:
        expected = probs[token_id].item() / mass
        assert abs(counts[token_id] / draws - expected) < 4 * (expected / draws) ** 0.5 + 1e-3


@pytest.mark.parametrize("scale", [0.2, 1.0, 6.0])  # flat rows need the full sort, peaked ones do not
def test_nucleus_with_few_candidates_matches_transformers(
    monkeypatch: pytest.MonkeyPatch, scale: float
) -> None:
    monkeypatch.setattr(sampler_module, "_NUCLEUS_CANDIDATES", (4, 32))
    logits = logits_for(6, 256, seed=3, scale=scale)
    mass = torch.tensor([0.1, 0.5, 0.9, 0.95, 0.3, 0.99])
    probs = torch.softmax(logits, -1)
    remove = logits < sampler_module._nucleus_threshold(logits, probs, mass)
    for i in range(6):
        expected = TopPLogitsWarper(mass[i].item())(None, logits[i : i + 1].clone())[0] == float("-inf")
        assert torch.equal(remove[i], expected)
        logp = torch.log_softmax(logits[i : i + 1], -1)
        key = -(logp + (-(logp.exp() * logp).sum())).abs()
        removed_typical = key < sampler_module._nucleus_threshold(key, probs[i : i + 1], mass[i : i + 1])
        expected = TypicalLogitsWarper(mass[i].item())(None, logits[i : i + 1].clone())[0] == float("-inf")
        assert torch.equal(removed_typical[0], expected)


def test_sampling_without_seed_is_an_error() -> None:
    with pytest.raises(ValueError, match="seed"):
        Sampler().sample(torch.zeros(1, 8), [seq([1], do_sample=True)])


def test_twenty_top_n_tokens_as_openai_top_logprobs_allows() -> None:
    logits = logits_for(2, 300)
    out = Sampler().sample(logits, [seq([1], top_n_tokens=20), seq([1], top_n_tokens=3)])
    expected = torch.log_softmax(logits, -1).topk(20)
    assert [i for i, _ in out.top_tokens[0]] == expected.indices[0].tolist()
    assert [v for _, v in out.top_tokens[0]] == pytest.approx(expected.values[0].tolist(), abs=1e-6)
    assert [i for i, _ in out.top_tokens[1]] == expected.indices[1, :3].tolist()
