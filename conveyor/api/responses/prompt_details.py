"""Prompt logprobs in each dialect's shape: TGI's `details.prefill`, OpenAI's legacy completions
`echo` + `logprobs` (the prompt's tokens first), from the `prompt` of a job's first event."""

from __future__ import annotations

from conveyor.wire.job import JobEvent, PromptEventToken
from conveyor.wire.openai import CompletionLogprobs
from conveyor.wire.tgi import PrefillToken


def prompt_of(events: list[JobEvent]) -> list[PromptEventToken]:
    """The prompt tokens a job's first event carries (empty when it did not ask for them)."""
    first = events[0] if events else None
    return first.prompt or [] if first is not None and first.index == 0 else []


def prefill(events: list[JobEvent]) -> list[PrefillToken]:
    """TGI `decoder_input_details`: each prompt token with its logprob, the first one null."""
    return [PrefillToken(id=t.id, text=t.text, logprob=t.logprob) for t in prompt_of(events)]


def echo_logprobs(prompt: list[PromptEventToken]) -> CompletionLogprobs:
    """The prompt part of completions `logprobs` with `echo`, as OpenAI's legacy completions and
    vLLM: one entry per prompt token, the first with logprob and top_logprobs null; each
    top_logprobs holds the top N and the token itself (so a reader can tell whether it was greedy)."""
    out = CompletionLogprobs(top_logprobs=[])
    offset = 0
    for i, t in enumerate(prompt):
        out.tokens.append(t.text)
        out.token_logprobs.append(t.logprob)
        top = None
        if i > 0:
            top = {a.text: a.logprob or 0.0 for a in t.top_tokens}
            top[t.text] = t.logprob or 0.0
        out.top_logprobs.append(top)  # type: ignore[union-attr]
        out.text_offset.append(offset)
        offset += len(t.text)
    return out


def joined(head: CompletionLogprobs, tail: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(tokens=head.tokens + tail.tokens,
                              token_logprobs=head.token_logprobs + tail.token_logprobs,
                              top_logprobs=(head.top_logprobs or []) + (tail.top_logprobs or []),
                              text_offset=head.text_offset + tail.text_offset)
