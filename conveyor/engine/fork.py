"""Several sequences of one request (OpenAI `n`, TGI `best_of`): their seeds and their sequences.

The request's prompt is prefilled once, by the first choice; the others wait as its `forks` and
join at its first sampled token, sharing its KV blocks (conveyor/engine/block_manager.py `fork`) and
sampling their own first token from the same logits. A resumed request (another worker had
started it) brings each unfinished choice's tokens: a choice with tokens runs as its own sequence
(prefix caching still shares the prompt's full blocks), the ones without fork as above.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence as Seq

from conveyor.engine.params import SamplingParams, StoppingParams
from conveyor.engine.sampler import _splitmix64
from conveyor.engine.sequence import Sequence


def choice_seed(seed: int | None, choice: int) -> int | None:
    """Choice 0 keeps the request's seed, so it samples what the same request with n=1 does;
    choice i > 0 draws from a seed derived from (seed, i): a seeded request is reproducible."""
    if seed is None or choice == 0:
        return seed
    return _splitmix64(_splitmix64(seed) ^ (choice * 0x9E3779B97F4A7C15 & (2**64 - 1))) >> 1


def choices_of(n: int, generated: Seq[int], resumed: Mapping[int, Seq[int]] | None) -> dict[int, list[int]]:
    """Choice → its tokens so far: 0..n-1 (choice 0 with `generated`), or the resumed ones."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if resumed is None:
        return {0: list(generated), **{c: [] for c in range(1, n)}}
    if not resumed:
        raise ValueError("resumed names no choice to run")
    return {c: list(tokens) for c, tokens in sorted(resumed.items())}


def sequences(request_id: str, prompt_ids: Seq[int], sampling: SamplingParams, stopping: StoppingParams,
              priority: int, deadline: float | None, choices: Mapping[int, list[int]]) -> list[Sequence]:
    """One sequence per choice, to add to the scheduler; the choices without tokens but the first
    of them are that one's `forks` instead."""
    seqs: list[Sequence] = []
    for choice, tokens in choices.items():
        seq = Sequence(
            request_id=request_id, prompt_ids=list(prompt_ids),
            sampling=dataclasses.replace(sampling, seed=choice_seed(sampling.seed, choice)),
            stopping=stopping, priority=priority, deadline=deadline, choice=choice,
        )
        seq.token_ids.extend(tokens)
        seqs.append(seq)
    fresh = [s for s in seqs if s.num_generated == 0]
    if len(fresh) > 1:
        fresh[0].forks = tuple(fresh[1:])
    return [s for s in seqs if s not in fresh[1:]]
