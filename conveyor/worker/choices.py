"""A multi-choice job's events (OpenAI `n`, `best_of`; docs/design.md §1 step 5).

The engine numbers each choice's tokens on its own; the job's one event stream numbers its events
in the order this worker writes them, whatever their choice, so entry ids stay unique and rising
(`0-(index+1)`, conveyor/jobqueue/keys.py), the relay's dedup by index and Last-Event-ID work unchanged,
and each (choice, token) is written once: an event's stream index is fixed when it is made, before
the (retried, idempotent) publish. A choice's last event carries its `choice_end`; the job's final
event is the end of its last choice, with every choice in the result.

Resume: the event stream says, per choice, the tokens written and whether it ended; the new owner
runs only the unfinished choices, each from its tokens (engine `resumed`), and goes on numbering
after the last event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.wire.job import ChoiceResult, JobEvent, JobResult, JobStatus, Usage

# The job's status when its choices ended so: one cancelled or expired choice makes the job so.
_WORST = (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED)


@dataclass(slots=True)
class Choices:
    width: int  # sequences the job generates
    next_index: int = 0  # the stream index of the job's next event
    tokens: dict[int, list[int]] = field(default_factory=dict)  # choice → its token ids so far
    texts: dict[int, list[str]] = field(default_factory=dict)  # choice → its tokens' texts (not special)
    logprobs: dict[int, float] = field(default_factory=dict)
    ended: dict[int, ChoiceResult] = field(default_factory=dict)
    statuses: dict[int, JobStatus] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @classmethod
    def replay(cls, width: int, events: list[JobEvent], prompt_tokens: int) -> Choices:
        """The state of a job from its event stream (in index order), as another worker left it."""
        choices = cls(width, prompt_tokens=prompt_tokens)
        for event in events:
            choices._record(event)
            choices.next_index = max(choices.next_index, event.index + 1)
            if event.choice_end is not None:
                choices.ended[event.choice] = event.choice_end
                choices.statuses[event.choice] = _status_of(event.choice_end.finish_reason)
        return choices

    @property
    def finished(self) -> bool:
        return len(self.ended) >= self.width

    def unfinished(self) -> dict[int, list[int]]:
        """Choice → tokens so far, for each choice still to run (the engine's `resumed`)."""
        return {c: list(self.tokens.get(c, [])) for c in range(self.width) if c not in self.ended}

    def track(self, choice: int, event: JobEvent) -> JobEvent:
        """Make an event of one choice (as conveyor/worker/translate.py makes it for a one-choice job: its
        per-choice index, its result) into the job's next stream event."""
        event.choice = choice
        event.index = self.next_index
        self.next_index += 1
        self._record(event)
        result, event.result, event.final = event.result, None, False
        if result is not None:
            if result.usage is not None:
                self.prompt_tokens = result.usage.prompt_tokens
                self.cached_tokens = max(self.cached_tokens, result.usage.cached_tokens)
            count = result.usage.completion_tokens if result.usage else len(self.tokens.get(choice, []))
            event.choice_end = ChoiceResult(
                index=choice, generated_text=result.generated_text, finish_reason=result.finish_reason or "",
                completion_tokens=count, seed=result.seed, logprob=self.logprobs.get(choice, 0.0),
            )
            self.ended[choice] = event.choice_end
            self.statuses[choice] = result.status
            if self.finished:
                event.final = True
                event.result = self.result()
        return event

    def result(self, status: JobStatus | None = None, error: str | None = None) -> JobResult:
        """The job's result: `status` (the api or intake ends it) or what its choices ended with;
        choices not ended get the job's status and the text they had."""
        status = status or next((s for s in _WORST if s in self.statuses.values()), JobStatus.SUCCEEDED)
        ends = [self.ended.get(c) or self._partial(c, status) for c in range(self.width)]
        first = ends[0]
        result = JobResult.final(
            status, reason=first.finish_reason, error=error, generated_text=first.generated_text,
            usage=Usage(prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens,
                        completion_tokens=sum(e.completion_tokens for e in ends)),
            seed=first.seed,
        )
        result.choices = ends
        return result

    def _partial(self, choice: int, status: JobStatus) -> ChoiceResult:
        reason = "error" if status is JobStatus.FAILED else status.value
        return ChoiceResult(index=choice, generated_text="".join(self.texts.get(choice, [])),
                            finish_reason=reason, completion_tokens=len(self.tokens.get(choice, [])),
                            logprob=self.logprobs.get(choice, 0.0))

    def _record(self, event: JobEvent) -> None:
        if event.token is None:
            return
        self.tokens.setdefault(event.choice, []).append(event.token.id)
        if not event.token.special:
            self.texts.setdefault(event.choice, []).append(event.token.text)
        self.logprobs[event.choice] = self.logprobs.get(event.choice, 0.0) + (event.token.logprob or 0.0)


def _status_of(finish_reason: str) -> JobStatus:
    for status in _WORST:
        if finish_reason == ("error" if status is JobStatus.FAILED else status.value):
            return status
    return JobStatus.SUCCEEDED
