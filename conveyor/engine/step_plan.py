"""The plan of one step: what the scheduler decides and the model runner executes."""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.engine.prompt_logprobs import PromptScore
from conveyor.engine.sequence import Sequence


@dataclass(slots=True)
class ScheduledChunk:
    """Tokens `seq.token_ids[start:start + length]` at positions start..start+length-1.

    A decode is a chunk of length 1. `sample` is true when the chunk reaches the end of the
    sequence's tokens: the forward then returns logits for its last position.
    The block table already covers every position up to start + length. A request that asks for
    no token (max_new_tokens 0: scoring only) never samples. `prompt_scores`: what the forward
    scored of the prompt in this chunk (conveyor/engine/prompt_logprobs.py), filled by the model runner.
    `draft`'s tokens are not in `seq.token_ids` and their block table room is the draft's own.
    """

    seq: Sequence
    start: int
    length: int
    prompt_scores: list[PromptScore] = field(default_factory=list)
    # Speculative decoding (a decode only): tokens guessed to follow, at positions start+1...; the
    # forward returns logits for each of the 1 + len(draft) positions (conveyor/engine/speculative/).
    draft: list[int] = field(default_factory=list)

    @property
    def completes(self) -> bool:
        """The chunk reaches the end of the sequence's tokens."""
        return self.start + self.length == self.seq.num_tokens

    @property
    def sample(self) -> bool:
        return self.completes and self.seq.stopping.max_new_tokens > 0


@dataclass(slots=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # lost their KV this step
    expired: list[Sequence] = field(default_factory=list)  # deadline passed while waiting

    @property
    def num_tokens(self) -> int:
        return sum(c.length for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks
