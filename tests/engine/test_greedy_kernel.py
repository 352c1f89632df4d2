"""The sampler's fused greedy pick (conveyor/engine/native/greedy.cpp): torch.argmax's token and log_softmax's
logprob at the real vocabulary size, the same alone or in any batch, and the torch path agreeing."""

from __future__ import annotations

import pytest
import torch

from conveyor.engine.native import greedy as greedy_kernel
from conveyor.engine.params import SamplingParams
from conveyor.engine.sampler import Sampler
from conveyor.engine.sequence import Sequence

VOCAB = 49152


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    if greedy_kernel.load() is None:
        pytest.skip("the greedy kernel could not be built here (see the logged warning)")


def seq(**sampling: object) -> Sequence:
    return Sequence(request_id="r", prompt_ids=[1, 2], sampling=SamplingParams(**sampling))


def logits_for(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_argmax_and_logprob_as_torch_gives_them() -> None:
    x = logits_for(7, 0)
    x[1, 5] = x[1, 900] = x[1].max() + 1  # a tie: the first index wins, as in torch.argmax
    x[2, 100:] = float("-inf")  # a grammar-masked row
    x[3, VOCAB - 3] = x[3].max() + 2  # the best in the vector tail
    index, logprob = greedy_kernel.greedy(x)
    assert index.tolist() == x.argmax(-1).tolist()
    want = torch.log_softmax(x, -1).gather(1, index[:, None])[:, 0]
    assert torch.allclose(logprob, want, rtol=0, atol=2e-6)


def test_nan_and_all_masked_rows_give_what_torch_gives() -> None:
    x = logits_for(3, 1)
    x[0, 17] = float("nan")
    x[1] = float("-inf")
    index, logprob = greedy_kernel.greedy(x)
    assert index.tolist() == x.argmax(-1).tolist()
    assert torch.isnan(logprob[:2]).all() and not torch.isnan(logprob[2])


def test_greedy_row_is_the_same_alone_or_anywhere_in_any_batch() -> None:
    row = logits_for(1, 2)
    target = seq()
    alone = Sampler().sample(row, [target])
    others = [seq(), seq(do_sample=True, seed=3, top_p=0.9), seq(top_n_tokens=2), seq(repetition_penalty=1.3)]
    for position in range(len(others) + 1):
        batch = others[:position] + [target] + others[position:]
        logits = logits_for(len(batch), 3)
        logits[position] = row[0]
        out = Sampler().sample(logits, batch)
        assert out.token_ids[position] == alone.token_ids[0]
        assert out.logprobs[position] == alone.logprobs[0]
        # Every row as the torch path (log_softmax + argmax, or the draw) gives it, in its place.
        for i, s in enumerate(batch):
            one = Sampler()._general(logits[i : i + 1], True, [s])
            assert out.token_ids[i] == one.token_ids[0]
            assert out.logprobs[i] == pytest.approx(one.logprobs[0], abs=2e-6)
            assert out.top_tokens[i] == one.top_tokens[0]


def test_without_the_kernel_the_tokens_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    logits = logits_for(16, 4)
    seqs = [seq() for _ in range(16)]
    fused = Sampler().sample(logits, seqs)
    monkeypatch.setattr(greedy_kernel, "usable", lambda x: False)
    plain = Sampler().sample(logits, seqs)
    assert fused.token_ids == plain.token_ids
    assert fused.logprobs == pytest.approx(plain.logprobs, abs=2e-6)
