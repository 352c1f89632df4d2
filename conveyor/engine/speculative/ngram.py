"""Draft tokens by prompt lookup (n-gram matching over the sequence's own tokens), no draft model.

The last n tokens of a sequence (n from `max_n` down to `min_n`) are looked up earlier in its
prompt and output; the tokens that followed the most recent earlier occurrence are the draft.
Copy-heavy work (editing, quoting, code, extraction) repeats its input, and there the draft is
often what the model would write anyway: one forward then yields several tokens.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Proposer(Protocol):
    """What the engine asks of a source of draft tokens (n-gram lookup here; a draft model later)."""

    def propose(self, token_ids: Seq[int], num_tokens: int) -> list[int]:
        """Up to `num_tokens` tokens guessed to follow `token_ids` (none: no guess)."""
        ...


@dataclass(slots=True, frozen=True)
class NgramProposer:
    """vLLM's prompt_lookup_min / prompt_lookup_max: the n-gram lengths tried, longest first."""

    min_n: int = 1
    max_n: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"n-gram lengths must satisfy 1 <= min ({self.min_n}) <= max ({self.max_n})")

    def propose(self, token_ids: Seq[int], num_tokens: int) -> list[int]:
        count = len(token_ids)
        if num_tokens <= 0 or count <= self.min_n:
            return []
        ids = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, count - 1), self.min_n - 1, -1):
            # Windows starting at 0..count-n-1: every earlier occurrence, not the suffix itself.
            windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
            hits = np.flatnonzero((windows == ids[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n  # the most recent occurrence: the likeliest to continue
                return ids[start : start + num_tokens].tolist()
        return []
