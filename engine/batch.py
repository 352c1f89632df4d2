"""The plan of one step: what the scheduler decides and the model runner executes."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sequence import Sequence


@dataclass(slots=True)
class ScheduledChunk:
    """Tokens `seq.token_ids[start:start + length]` at positions start..start+length-1.

    A decode is a chunk of length 1. `sample` is true when the chunk reaches the end of the
    sequence's tokens: the forward then returns logits for its last position.
    The block table already covers every position up to start + length.
    """

    seq: Sequence
    start: int
    length: int

    @property
    def sample(self) -> bool:
        return self.start + self.length == self.seq.num_tokens


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
