"""One request inside the engine: its tokens, its KV blocks and where it stands."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from engine.params import SamplingParams, StoppingParams


class FinishReason(StrEnum):
    EOS = "eos_token"
    LENGTH = "length"
    STOP_SEQUENCE = "stop_sequence"
    ABORTED = "aborted"
    EXPIRED = "expired"


class SequenceStatus(IntEnum):
    """Ordered: every status above PREEMPTED is finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_EOS = 3
    FINISHED_LENGTH = 4
    FINISHED_STOP_SEQUENCE = 5
    FINISHED_ABORTED = 6
    FINISHED_EXPIRED = 7

    @property
    def is_finished(self) -> bool:
        return self > SequenceStatus.PREEMPTED

    @classmethod
    def finished(cls, reason: FinishReason) -> SequenceStatus:
        return _FINISHED_BY_REASON[reason]


_FINISHED_BY_REASON = {
    FinishReason.EOS: SequenceStatus.FINISHED_EOS,
    FinishReason.LENGTH: SequenceStatus.FINISHED_LENGTH,
    FinishReason.STOP_SEQUENCE: SequenceStatus.FINISHED_STOP_SEQUENCE,
    FinishReason.ABORTED: SequenceStatus.FINISHED_ABORTED,
    FinishReason.EXPIRED: SequenceStatus.FINISHED_EXPIRED,
}
_REASON_BY_FINISHED = {status: reason for reason, status in _FINISHED_BY_REASON.items()}

# Tie-breaker for equal arrival times: admission order is total and stable.
_arrival_counter = itertools.count()


@dataclass(slots=True, eq=False)
class Sequence:
    """A request's state. `token_ids` holds prompt then generated tokens.

    `num_computed_tokens` counts the tokens whose KV is in the cache; the tokens from there to the
    end of `token_ids` are what the next forward must process (a prefill chunk, or the one token
    sampled last step). `priority`: higher is served first and preempted last.
    `deadline`: absolute time (the engine's clock, `time.time()` by default) after which a request
    that has not started is finished as expired.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stopping: StoppingParams = field(default_factory=StoppingParams)
    priority: int = 0
    deadline: float | None = None
    arrival: float = 0.0
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    block_table: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    order: int = field(default_factory=lambda: next(_arrival_counter))

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def generated_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> FinishReason | None:
        return _REASON_BY_FINISHED.get(self.status)

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
