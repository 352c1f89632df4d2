"""One request inside the engine: its tokens, its KV blocks and where it stands."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from conveyor.engine.params import SamplingParams, StoppingParams
from conveyor.engine.prompt_logprobs import PromptScore

if TYPE_CHECKING:
    from conveyor.engine.grammar import GrammarMatcher
    from conveyor.engine.speculative.policy import DraftState


class FinishReason(StrEnum):
    EOS = "eos_token"
    LENGTH = "length"
    STOP_SEQUENCE = "stop_sequence"
    ABORTED = "aborted"
    EXPIRED = "expired"


class SequenceStatus(StrEnum):
    """Where a sequence stands; why a FINISHED one ended is its `finish_reason`."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


# Arrival order, the tie-breaker between equal priorities: service order is total and stable.
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
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    expected_hit_tokens: int = 0  # ... as it held them when the request arrived (the backlog's guess)
    block_table: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None  # set with status FINISHED, never without it
    order: int = field(default_factory=lambda: next(_arrival_counter))
    # Shortest-first admission's key: prefill tokens the scheduler had served when this arrived,
    # plus this one's own prefill (conveyor/engine/scheduler.py).
    admission_tag: int = 0
    matcher: GrammarMatcher | None = None  # where the output stands in `sampling.grammar`
    prompt_scores: list[PromptScore] = field(default_factory=list)  # of prompt tokens 1.., if asked
    # Several sequences of one request (OpenAI `n`, TGI `best_of`): which one this is, and the
    # other choices, not yet running, that fork this one when its prompt is computed (they share
    # its KV blocks instead of computing the prompt again; conveyor/engine/fork.py).
    choice: int = 0
    forks: tuple[Sequence, ...] = ()
    # Speculative decoding: the longest draft to propose next and the pause after misses
    # (conveyor/engine/speculative/policy.py); None: not speculated yet.
    drafting: DraftState | None = None

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
        return self.status is SequenceStatus.FINISHED

    def finish(self, reason: FinishReason) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
