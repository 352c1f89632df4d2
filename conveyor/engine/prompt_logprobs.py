"""Prompt logprobs (scoring): the model's log_softmax at each prompt position, for the requests that
ask (`SamplingParams.prompt_logprobs`).

Position p's logits score prompt token p + 1, so a prompt of P tokens has P - 1 scores; the first
token has none. The values are the raw model distribution (no bias, penalty or temperature), as
vLLM's `prompt_logprobs`. Only the rows of such requests go through the lm_head; a chunked prefill
adds its chunks' scores in order (`Sequence.prompt_scores`), and a prefix-cache hit, which has no
logits, is not taken until the scores are complete (conveyor/engine/scheduler.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Rows per lm_head call: bounds the float32 [rows, vocab] logits of a long prompt (~50 MB here).
SLICE_ROWS = 256


@dataclass(slots=True, frozen=True)
class PromptScore:
    """The score of one prompt token (from the previous position's logits)."""

    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), best first


def wants_scores(seq) -> bool:  # type: ignore[no-untyped-def]
    """The sequence asks for prompt logprobs and some are still to be computed."""
    return seq.sampling.prompt_logprobs is not None and len(seq.prompt_scores) < seq.num_prompt_tokens - 1


def scored_positions(seq, start: int, length: int) -> range:  # type: ignore[no-untyped-def]
    """The positions of a chunk [start, start + length) whose logits give a missing score: those
    below the last prompt token, from where the scores so far end (a recompute after preemption
    skips what it has)."""
    if seq.sampling.prompt_logprobs is None:
        return range(0)
    return range(max(start, len(seq.prompt_scores)), min(start + length, seq.num_prompt_tokens - 1))


def score(logits: torch.Tensor, targets: list[int], k: int) -> list[PromptScore]:
    """Scores of `targets` (one per row of float32 `logits`) and each row's top `k`."""
    logprobs = torch.log_softmax(logits, dim=-1)
    index = torch.tensor(targets, dtype=torch.long, device=logits.device)
    own = logprobs.gather(1, index[:, None])[:, 0].tolist()
    if k > 0:
        values, ids = logprobs.topk(min(k, logprobs.shape[1]), dim=-1)
        tops = [tuple(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    else:
        tops = [()] * len(own)
    return [PromptScore(lp, top) for lp, top in zip(own, tops, strict=True)]
