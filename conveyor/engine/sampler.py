"""Choosing the next token of every row of a batch, with per-row parameters in batched tensor ops.

Pipeline, per row (Hugging Face order, after vLLM's grammar mask and logit bias): the grammar's
token mask (rows with a grammar only), logit bias, repetition penalty,
frequency and presence penalties, temperature, then top-k, top-p, typical-p, then a draw. Rows pay
only for what they use (a batch with no logit bias touches no logit for it): on CPU a greedy row
without top-n tokens is one fused call (greedy.cpp: its argmax and logprob, no log_softmax of the
vocabulary); other greedy rows are an argmax, a log_softmax and an optional top-k; only rows with
top-p or typical-p rank the vocabulary.

Determinism: a sampled token depends only on its row's logits, parameters, seed and index. The draw
is one uniform derived from (seed, index) by a hash, read through the inverse CDF of the filtered
distribution; every op a row goes through is computed row by row (no reduction split across rows or
threads), so on CPU the result is bit-identical whatever else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from conveyor.engine.native import greedy as greedy_kernel
from conveyor.engine.params import SamplingParams
from conveyor.engine.sequence import Sequence

# Top-p/typical-p rank this many candidates first (a partial sort, much cheaper than sorting the
# whole vocabulary); only rows whose nucleus is not decided within them rank more, up to all.
_NUCLEUS_CANDIDATES = (64, 1024)
_MASK64 = (1 << 64) - 1


@dataclass(slots=True)
class SamplerOutput:
    """Per row: the chosen token, its logprob, and the `top_n_tokens` best as (id, logprob)."""

    token_ids: list[int]
    logprobs: list[float]
    top_tokens: list[list[tuple[int, float]]]


class Sampler:
    def __init__(self, build_kernel: bool = False) -> None:
        if build_kernel:  # compiled (or loaded from its cache) at start-up, not in the first step
            greedy_kernel.load()

    def sample(self, logits: Tensor, seqs: list[Sequence], ahead: list[int] | None = None) -> SamplerOutput:
        """Choose one token per row; row i of `logits` ([n, V], float32) belongs to `seqs[i]`.
        `ahead[i]`: row i chooses the token that many places after seq's next one (a draft's rows,
        speculative/verify.py): its draw is the one that token's index gets; default 0 for all.

        Logprobs (of the chosen token and of the top-n alternatives) are the log_softmax of the
        logits after penalties and temperature, before top-k/top-p/typical-p truncation. Greedy rows
        take the argmax after penalties and their temperature is not applied. `logits` is not
        modified.

        Greedy rows without top-n tokens (most traffic) take the fused kernel of greedy.cpp on CPU:
        the argmax and its logprob in one call, no log_softmax of the vocabulary (the same token;
        the logprob within a few float32 ulps of log_softmax's). The other rows go the general way.
        """
        params = [seq.sampling for seq in seqs]
        x = _apply_penalties(_apply_logit_bias(_apply_grammar(logits, seqs), seqs), seqs)
        fast = [i for i, p in enumerate(params) if p.greedy and not p.top_n_tokens]
        ahead = ahead or [0] * len(seqs)
        if not fast or not greedy_kernel.usable(x):
            return self._general(x, x is logits, seqs, ahead)
        if len(fast) == len(seqs):
            index, logprob = greedy_kernel.greedy(x)
            return SamplerOutput(index.tolist(), logprob.tolist(), [[] for _ in seqs])
        rest = [i for i, p in enumerate(params) if not p.greedy or p.top_n_tokens]
        index, logprob = greedy_kernel.greedy(x[torch.tensor(fast, device=x.device)])
        out = self._general(x[torch.tensor(rest, device=x.device)], False, [seqs[i] for i in rest],
                            [ahead[i] for i in rest])
        token_ids, logprobs = [0] * len(seqs), [0.0] * len(seqs)
        top_tokens: list[list[tuple[int, float]]] = [[] for _ in seqs]
        for i, token_id, lp in zip(fast, index.tolist(), logprob.tolist(), strict=True):
            token_ids[i], logprobs[i] = token_id, lp
        for j, i in enumerate(rest):
            token_ids[i], logprobs[i], top_tokens[i] = out.token_ids[j], out.logprobs[j], out.top_tokens[j]
        return SamplerOutput(token_ids, logprobs, top_tokens)

    def _general(
        self, x: Tensor, shared: bool, seqs: list[Sequence], ahead: list[int] | None = None
    ) -> SamplerOutput:
        """Any rows: log_softmax, the argmax or a draw, top-n. `shared`: x is the caller's logits,
        which the draw must not filter in place; `ahead` as in `sample`."""
        ahead = ahead or [0] * len(seqs)
        params = [seq.sampling for seq in seqs]
        temps = [1.0 if p.greedy else p.temperature for p in params]
        if any(t != 1.0 for t in temps):
            x, shared = x / torch.tensor(temps, device=x.device, dtype=x.dtype)[:, None], False
        logprobs = torch.log_softmax(x, dim=-1)

        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if not sampled:
            chosen = x.argmax(dim=-1)
        elif len(sampled) == len(seqs):
            chosen = _draw(x.clone() if shared else x, seqs, ahead)  # _draw filters in place
        else:
            chosen = x.argmax(dim=-1)
            rows = torch.tensor(sampled, device=x.device)
            chosen[rows] = _draw(x[rows], [seqs[i] for i in sampled], [ahead[i] for i in sampled])

        # One copy to the host, not two: on a GPU each .tolist() waits for the whole stream. float64
        # holds every token id exactly (vocabularies are far below 2**53).
        ids_and_logprobs = torch.stack((chosen.double(), logprobs.gather(1, chosen[:, None])[:, 0].double()))
        token_ids_f, chosen_logprobs = ids_and_logprobs.tolist()
        token_ids = [int(t) for t in token_ids_f]
        top_tokens: list[list[tuple[int, float]]] = [[] for _ in seqs]
        k = min(max((p.top_n_tokens for p in params), default=0), x.shape[1])
        if k > 0:
            top = logprobs.topk(k, dim=-1)
            for i, (ids, values) in enumerate(zip(top.indices.tolist(), top.values.tolist(), strict=True)):
                n = params[i].top_n_tokens
                top_tokens[i] = list(zip(ids[:n], values[:n], strict=True))
        return SamplerOutput(token_ids=token_ids, logprobs=chosen_logprobs, top_tokens=top_tokens)


def _apply_grammar(logits: Tensor, seqs: list[Sequence]) -> Tensor:
    """Sets to -inf the logits of the tokens a row's grammar forbids (structured output). Returns
    `logits` itself when no row has a grammar; else a copy, changing only the grammar rows."""
    rows = [i for i, seq in enumerate(seqs) if seq.matcher is not None]
    if not rows:
        return logits
    vocab = logits.shape[1]
    masks = np.stack([seqs[i].matcher.allowed(vocab) for i in rows])  # type: ignore[union-attr]
    allowed = torch.from_numpy(masks).to(logits.device)
    out = logits.clone(memory_format=torch.contiguous_format)
    index = torch.tensor(rows, device=logits.device)
    out[index] = out[index].masked_fill(~allowed, float("-inf"))
    return out


def _apply_logit_bias(logits: Tensor, seqs: list[Sequence]) -> Tensor:
    """Adds each row's (token, bias) pairs to its logits (OpenAI's logit_bias). Returns `logits`
    itself when no row has a bias; else a copy, touching only the biased entries."""
    vocab = logits.shape[1]
    pairs = [(i * vocab + token, bias) for i, seq in enumerate(seqs)
             for token, bias in seq.sampling.logit_bias if 0 <= token < vocab]
    if not pairs:
        return logits
    flat = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=logits.device)
    values = torch.tensor([p[1] for p in pairs], dtype=logits.dtype, device=logits.device)
    out = logits.clone(memory_format=torch.contiguous_format)
    out.view(-1).index_add_(0, flat, values)
    return out


def _apply_penalties(logits: Tensor, seqs: list[Sequence]) -> Tensor:
    """Repetition penalty (HF: over prompt and generated tokens, divide positive logits and multiply
    negative ones), then frequency and presence penalties (OpenAI: over generated tokens,
    `logit - frequency * count - presence`). Returns `logits` itself when no row has a penalty.

    Only the logits of tokens that occur are touched: a few thousand, not rows * V."""
    penalized = [(i, seq) for i, seq in enumerate(seqs) if seq.sampling.uses_penalties]
    if not penalized:
        return logits
    device, vocab = logits.device, logits.shape[1]
    out = logits.clone(memory_format=torch.contiguous_format)
    flat_out = out.view(-1)

    def occurring(token_lists: list[tuple[int, list[int]]]) -> tuple[Tensor, Tensor, Tensor]:
        """Distinct (row, token) pairs as flat indices row * V + token, their rows and counts."""
        parts = [torch.tensor(ids, dtype=torch.long) + i * vocab for i, ids in token_lists]
        flat, counts = torch.cat(parts).to(device).unique(return_counts=True)
        return flat, flat // vocab, counts.to(logits.dtype)

    rep = [(i, seq) for i, seq in penalized if seq.sampling.repetition_penalty != 1.0]
    if rep:
        flat, rows, _ = occurring([(i, seq.token_ids) for i, seq in rep])
        penalty = _per_row([s.sampling.repetition_penalty for s in seqs], logits)[rows]
        values = flat_out[flat]
        flat_out[flat] = torch.where(values < 0, values * penalty, values / penalty)

    additive = [(i, s) for i, s in penalized if s.sampling.frequency_penalty or s.sampling.presence_penalty]
    if additive:
        flat, rows, counts = occurring([(i, seq.generated_ids) for i, seq in additive])
        frequency = _per_row([s.sampling.frequency_penalty for s in seqs], logits)[rows]
        presence = _per_row([s.sampling.presence_penalty for s in seqs], logits)[rows]
        flat_out[flat] = flat_out[flat] - frequency * counts - presence
    return out


def _draw(x: Tensor, seqs: list[Sequence], ahead: list[int]) -> Tensor:
    """Sample one token per row of temperature-scaled logits `x` (filtered in place) after top-k,
    top-p and typical-p, applied in that order as in HF."""
    params = [seq.sampling for seq in seqs]
    vocab = x.shape[1]
    stages = (
        (lambda p: 0 < p.top_k < vocab, _top_k),
        (lambda p: p.top_p < 1.0, _top_p),
        (lambda p: p.typical_p < 1.0, _typical),
    )
    for applies, stage in stages:
        rows = [j for j, p in enumerate(params) if applies(p)]
        if not rows:
            continue
        # A stage that covers every row works on a view of x; otherwise on a copy, written back.
        select: slice | Tensor = (
            slice(None) if len(rows) == len(params) else torch.tensor(rows, device=x.device)
        )
        sub = x[select]
        key, threshold = stage(sub, [params[j] for j in rows])
        sub.masked_fill_(key < threshold, float("-inf"))
        if isinstance(select, Tensor):
            x[select] = sub

    # Inverse CDF in token-id order: the first token whose cumulative mass exceeds u * total.
    cdf = torch.softmax(x, dim=-1).cumsum(dim=-1)
    total = cdf[:, -1:]
    u = torch.tensor([[_uniform(seq, a)] for seq, a in zip(seqs, ahead, strict=True)], device=x.device,
                     dtype=cdf.dtype)
    # Below total, so the search always lands on a token with non-zero probability.
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=vocab - 1)


# Each stage returns (key, threshold): tokens whose key is below their row's threshold are removed.


def _top_k(x: Tensor, params: list[SamplingParams]) -> tuple[Tensor, Tensor]:
    """HF TopKLogitsWarper: the k best, and any token tied with the k-th."""
    ks = torch.tensor([p.top_k for p in params], device=x.device)
    return x, x.topk(int(ks.max()), dim=-1).values.gather(1, (ks - 1)[:, None])


def _top_p(x: Tensor, params: list[SamplingParams]) -> tuple[Tensor, Tensor]:
    """HF TopPLogitsWarper: the most likely tokens, while the mass kept before each is below p."""
    return x, _nucleus_threshold(x, torch.softmax(x, dim=-1), _per_row([p.top_p for p in params], x))


def _typical(x: Tensor, params: list[SamplingParams]) -> tuple[Tensor, Tensor]:
    """HF TypicalLogitsWarper: the same walk, by surprise (-log p) closest to the entropy."""
    logp = torch.log_softmax(x, dim=-1)
    probs = logp.exp()
    # The last element of a cumsum is a row-serial sum: bit-identical whatever the batch.
    entropy = -torch.special.xlogy(probs, probs).cumsum(dim=-1)[:, -1:]
    key = logp.add_(entropy).abs_().neg_()
    return key, _nucleus_threshold(key, probs, _per_row([p.typical_p for p in params], x))


def _nucleus_threshold(key: Tensor, probs: Tensor, mass: Tensor) -> Tensor:
    """Walking each row by decreasing `key`, a token is kept while the mass kept before it is below
    the row's `mass` (the first always). Returns the key of the last kept token, per row ([r, 1])."""
    rows, vocab = probs.shape
    threshold = torch.empty(rows, 1, dtype=key.dtype, device=key.device)
    pending: Tensor | None = None  # None: every row, no copy
    for k in (*(c for c in _NUCLEUS_CANDIDATES if c < vocab), vocab):
        values, idx = (key if pending is None else key[pending]).topk(k, dim=-1)
        row_index = torch.arange(rows, device=key.device) if pending is None else pending
        cum = probs[row_index[:, None], idx].cumsum(dim=-1)
        before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=-1)  # monotone, exact
        kept = (before < mass[row_index, None]).sum(dim=-1, keepdim=True).clamp_(min=1)
        # Decided when a candidate is dropped (every later token is dropped too) or all are ranked.
        done = (kept[:, 0] < k) | (k == vocab)
        threshold[row_index[done]] = values.gather(1, kept - 1)[done]
        if bool(done.all()):
            break
        pending = row_index[~done]
    return threshold


def _per_row(values: list[float], like: Tensor) -> Tensor:
    return torch.tensor(values, device=like.device, dtype=like.dtype)


def _uniform(seq: Sequence, ahead: int = 0) -> float:
    """A uniform in [0, 1) from (seed, index of the token): the same on any worker and in any batch,
    and for a draft's row `ahead` places on the same as a step at a time. 24 bits: exact in float32."""
    seed = seq.sampling.seed
    if seed is None:
        raise ValueError(f"request {seq.request_id} samples without a seed; the engine must set one")
    return (_splitmix64(_splitmix64(seed) ^ (seq.num_generated + ahead)) >> 40) / float(1 << 24)


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)
