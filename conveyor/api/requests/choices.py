"""Several choices of one job (OpenAI `n` and `best_of`, TGI `best_of`): their limits, their events,
and which ones an answer returns. The job generates `width` sequences (docs/design.md §1: one event
stream, `choice` on each event); the api picks what the dialect returns.

Limits: `max_best_of` bounds the sequences of one request in every dialect (TGI's name and
messages); with `max_batch_total_tokens` set, the prompt plus every sequence's `max_tokens` must fit
in it (the prompt's KV is shared, each sequence's own tokens are not).
"""

from __future__ import annotations

from conveyor.api.errors import ValidationError
from conveyor.settings import Settings
from conveyor.wire.job import ChoiceResult, JobEvent, JobResult


def check_openai(settings: Settings, n: int, best_of: int | None, stream: bool) -> None:
    """OpenAI's and vLLM's rules: best_of >= n, not streamed unless it equals n."""
    cap = settings.max_best_of
    if n > cap:
        raise ValidationError(f"`n` must be <= {cap} (max_best_of). Given: {n}", param="n")
    if best_of is None:
        return
    if best_of < n:
        raise ValidationError(f"`best_of` must be >= `n`. Given: n={n} and best_of={best_of}",
                              param="best_of")
    if best_of > cap:
        raise ValidationError(f"`best_of` must be <= {cap} (max_best_of). Given: {best_of}", param="best_of")
    if stream and best_of != n:
        raise ValidationError("`best_of` != `n` is not supported when streaming: the best ones are "
                              "known only at the end; send stream=false or best_of=n", param="best_of")


def check_tgi(settings: Settings, best_of: int, samples: bool, seed: int | None, stream: bool) -> None:
    """TGI's validation of `best_of`, with its messages."""
    if best_of == 1:
        return
    if settings.max_best_of == 1:
        raise ValidationError("`best_of` != 1 is not allowed for this endpoint", param="best_of")
    if best_of > settings.max_best_of:
        raise ValidationError(f"`best_of` must be > 0 and <= {settings.max_best_of}. Given: {best_of}",
                              param="best_of")
    if not samples:
        raise ValidationError("you must use sampling when `best_of` is > 1", param="best_of")
    if seed is not None:
        raise ValidationError("`seed` must not be set when `best_of` > 1", param="seed")
    if stream:
        raise ValidationError("`best_of` != 1 is not supported when streaming tokens", param="best_of")


def check_tokens(settings: Settings, width: int, prompt_tokens: int, max_new_tokens: int,
                 field: str, max_field: str) -> None:
    """Every sequence may run to max_new_tokens: together they must fit the batch token budget."""
    limit = settings.max_batch_total_tokens
    if width == 1 or limit is None:
        return
    total = prompt_tokens + width * max_new_tokens
    if total > limit:
        raise ValidationError(
            f"prompt tokens + `{field}` × `{max_field}` must be <= {limit} (max_batch_total_tokens). Given: "
            f"{prompt_tokens} + {width} × {max_new_tokens} = {total}; lower `{field}` or `{max_field}`",
            param=field,
        )


def events_of(events: list[JobEvent], choice: int) -> list[JobEvent]:
    return [e for e in events if e.choice == choice]


def choices(result: JobResult) -> list[ChoiceResult]:
    """Every choice of a finished job; a one-choice job's result is its only choice."""
    if result.choices:
        return list(result.choices)
    usage = result.usage
    return [ChoiceResult(index=0, generated_text=result.generated_text, seed=result.seed,
                         finish_reason=result.finish_reason or "",
                         completion_tokens=usage.completion_tokens if usage else 0)]


def best(result: JobResult, n: int) -> list[ChoiceResult]:
    """The n choices to answer: all of them in order, or of more (best_of > n) the n with the
    highest cumulative logprob, best first (as vLLM)."""
    every = choices(result)
    return every if len(every) <= n else sorted(every, key=lambda c: -c.logprob)[:n]


def best_by_mean(result: JobResult) -> tuple[ChoiceResult, list[ChoiceResult]]:
    """TGI's best_of: the choice with the highest mean logprob per token, and the others."""
    ranked = choices(result)
    top = max(ranked, key=lambda c: c.logprob / max(1, c.completion_tokens))
    return top, [c for c in ranked if c is not top]
