"""A job as it travels through Redis: the spec the api writes, the events the worker publishes,
the record both keep up to date. Shared by api and worker; no dialect-specific shapes here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import AnyHttpUrl, BaseModel, Field, field_validator, model_validator

from conveyor.wire.grammar import GrammarSpec


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def is_terminal(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.RUNNING)


class SamplingSpec(BaseModel):
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    top_n_tokens: int = 0
    logit_bias: dict[int, float] = Field(default_factory=dict)  # token id → added to its logit
    grammar: GrammarSpec | None = None  # structured output: only tokens the grammar allows
    # Prompt logprobs: None: not computed; k: each prompt token's logprob and its top k (0: none).
    prompt_logprobs: int | None = Field(default=None, ge=0)
    speculate: bool = True  # false: this job decodes one token a step whatever the worker's --speculate


class StoppingSpec(BaseModel):
    max_new_tokens: int = Field(ge=0)  # 0 only with sampling.prompt_logprobs (JobSpec checks)
    stop: list[str] = Field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False  # TGI: the matched stop sequence ends the text; OpenAI: not


WebhookEvent = Literal["started", "completed"]


class Webhook(BaseModel):
    """Where to tell a web backend about its job (delivered by the webhook worker, signed)."""

    url: AnyHttpUrl
    events: list[WebhookEvent] = Field(default=["completed"], min_length=1)

    @field_validator("events")
    @classmethod
    def _unique(cls, events: list[str]) -> list[str]:
        return list(dict.fromkeys(events))


JobKind = Literal["generate", "chat", "completion"]


class JobSpec(BaseModel):
    """What a worker needs to run a job; written once by the api, never changed."""

    id: str
    tenant: str = "default"
    created_at: float
    prompt_ids: list[int]
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    stopping: StoppingSpec
    priority: int = 0  # higher is served first
    deadline: float | None = None  # epoch seconds; a job still queued then ends `expired`
    kind: JobKind = "generate"  # the body it was submitted with (TGI generate, OpenAI chat/completion)
    webhook: Webhook | None = None
    traceparent: str | None = None  # W3C trace context of the api's span, when tracing is on
    # Choices (OpenAI `n`) the answer returns, and sequences generated for them (OpenAI and TGI
    # `best_of`, >= n; None: n). Each is a sequence of the one engine request; the result has them all.
    n: int = Field(default=1, ge=1)
    best_of: int | None = Field(default=None, ge=1)
    # The model's queue (conveyor/jobqueue/models.py): None for the default model, so a one-model
    # deployment's specs are written exactly as before.
    model: str | None = None

    @property
    def width(self) -> int:
        """Sequences the job generates."""
        return max(self.n, self.best_of or 1)

    @model_validator(mode="after")
    def _scoring_only(self) -> JobSpec:
        if self.stopping.max_new_tokens == 0 and self.sampling.prompt_logprobs is None:
            raise ValueError("stopping.max_new_tokens 0 (score only) needs sampling.prompt_logprobs")
        return self


class EventToken(BaseModel):
    id: int
    text: str
    logprob: float | None = None
    special: bool = False


class PromptEventToken(BaseModel):
    """A prompt token with its logprob given the tokens before it (None for the first) and the
    top alternatives asked for (`SamplingSpec.prompt_logprobs`)."""

    id: int
    text: str
    logprob: float | None = None
    top_tokens: list[EventToken] = Field(default_factory=list)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


class Timings(BaseModel):
    """Seconds, measured from the job's `created_at` (when the api accepted it)."""

    queue_s: float | None = None  # until a worker first started it
    ttft_s: float | None = None  # until its first token was published
    total_s: float  # until its final record was written


class ChoiceResult(BaseModel):
    """How one sequence of a multi-choice job ended. `logprob`: the sum of its tokens' logprobs
    (what best_of ranks by)."""

    index: int
    generated_text: str = ""
    finish_reason: str  # as JobResult's
    completion_tokens: int = 0
    seed: int | None = None
    logprob: float = 0.0


class JobResult(BaseModel):
    status: JobStatus
    generated_text: str = ""
    finish_reason: str | None = None  # eos_token | length | stop_sequence | cancelled | expired | error
    usage: Usage | None = None
    seed: int | None = None
    error: str | None = None
    timings: Timings | None = None
    # A multi-choice job's (width > 1) every choice, by index; generated_text, finish_reason and seed
    # above are choice 0's, usage counts the completion tokens of them all.
    choices: list[ChoiceResult] | None = None

    @classmethod
    def final(cls, status: JobStatus, *, reason: str | None = None, error: str | None = None,
              generated_text: str = "", usage: Usage | None = None, seed: int | None = None) -> JobResult:
        """A job's final result, wherever it ends (worker or api). `finish_reason` follows the status:
        the engine's `reason` for a success, `error` for a failure, else the status itself."""
        if not status.is_terminal:
            raise ValueError(f"a final result needs a terminal status, not {status.value}")
        if status is JobStatus.SUCCEEDED:
            if reason is None:
                raise ValueError("a succeeded job's result needs the engine's finish reason")
            finish_reason = reason
        else:
            finish_reason = "error" if status is JobStatus.FAILED else status.value
        return cls(status=status, generated_text=generated_text, finish_reason=finish_reason, usage=usage,
                   seed=seed, error=error)


class JobEvent(BaseModel):
    """One entry of a job's event stream and pub/sub channel.

    Token events have index 0..n-1. The last event of a job has `final` set and carries the result;
    it is the last token's event, or — for a job that ends without a token (cancelled, expired,
    failed, or scored only: max_new_tokens 0) — an event without `token` whose index is the number of
    tokens before it. `prompt`: on the event of index 0 of a job that asked for prompt logprobs,
    every prompt token (a resumed job keeps it in its stream and does not score again).

    A multi-choice job (width > 1) keeps one stream: `index` numbers its events 0, 1, 2, ... in the
    order the worker wrote them, whatever their choice (so entry ids, dedup and Last-Event-ID work
    as for one choice), `choice` says whose token it is, and each choice's last event carries
    `choice_end`; the job's final event is the last choice's end, with every choice in the result.
    """

    index: int
    token: EventToken | None = None
    top_tokens: list[EventToken] = Field(default_factory=list)
    final: bool = False
    result: JobResult | None = None
    at: float | None = None  # epoch seconds when the worker published it (the relay measures its lag)
    prompt: list[PromptEventToken] | None = None
    choice: int = 0
    choice_end: ChoiceResult | None = None

    @classmethod
    def ending(cls, index: int, result: JobResult) -> JobEvent:
        """The final event of a job that ends without a token of its own; `index`: tokens before it."""
        return cls(index=index, final=True, result=result)

    @classmethod
    def from_record(cls, record: dict[str, str]) -> JobEvent | None:
        """An ended job's final event as its record keeps it once its per-token events expired
        (`replay_window`): its index, `final`, and the whole result (text, usage, every choice);
        no token of its own. None while the job has not ended (or ended before records kept it)."""
        index, result = record.get(RecordField.FINAL), record.get(RecordField.RESULT)
        if index is None or result is None:
            return None
        return cls.ending(int(index), JobResult.model_validate_json(result))


# Fields of the job record hash.
class RecordField(StrEnum):
    STATUS = "status"
    SPEC = "spec"
    TENANT = "tenant"
    STARTED_AT = "started_at"
    FIRST_TOKEN_AT = "first_token_at"
    FINISHED_AT = "finished_at"
    WORKER = "worker"  # the worker that owns the job now: only it may append events (a fence)
    ATTEMPTS = "attempts"  # deliveries so far (1 = first run; more = resumed after a failure)
    SEED = "seed"  # fixed by the first worker for sampled jobs without one, so a resume continues exactly
    RESULT = "result"
    FINAL = "final"  # the index of the job's final event: a replay after `replay_window` ends there
    WATCHED = "watched"  # set once an api follows the job's events: only then does a worker publish them live
    CANCEL = "cancel"
    WEBHOOK_STARTED = "webhook_started"  # WebhookDelivery JSON: the `started` webhook's attempts
    WEBHOOK_COMPLETED = "webhook_completed"  # ... and the `completed` one's


def webhook_field(event: WebhookEvent) -> RecordField:
    return RecordField.WEBHOOK_STARTED if event == "started" else RecordField.WEBHOOK_COMPLETED


def webhook_id(job_id: str, event: WebhookEvent) -> str:
    """The `webhook-id` of a job's event: the same for every attempt, so a receiver can deduplicate."""
    return f"msg_{job_id}_{event}"


class WebhookAttempt(BaseModel):
    attempt: int  # 1 = the first try
    at: float  # epoch seconds
    status_code: int | None = None  # the receiver's answer; None: no answer (see error)
    error: str | None = None
    duration_s: float = 0.0


WebhookState = Literal["pending", "delivered", "retrying", "failed", "gone", "refused"]


class WebhookDelivery(BaseModel):
    """What became of one webhook (a job's event), kept in the job record while the record lives."""

    id: str
    event: WebhookEvent
    url: str
    state: WebhookState = "pending"
    attempts: list[WebhookAttempt] = Field(default_factory=list)
    next_attempt_at: float | None = None
