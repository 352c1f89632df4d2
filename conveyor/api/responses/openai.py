"""Pieces of OpenAI answers built from a job's events and result: finish reasons, usage, logprobs
(chat and legacy completions, with an echoed prompt), and a chat choice with its tool calls. Shared by
the streaming and the whole answers of conveyor/api/routes/openai.py and by batch results."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from conveyor.api.requests import tools
from conveyor.api.responses.prompt_details import echo_logprobs, joined, prompt_of
from conveyor.wire.job import ChoiceResult, EventToken, JobEvent, JobResult, JobSpec, PromptEventToken
from conveyor.wire.openai import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceLogprobs,
    Completion,
    CompletionLogprobs,
    CompletionUsage,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
)


def finish_reason(result: JobResult | ChoiceResult) -> str:
    return "length" if result.finish_reason == "length" else "stop"


def usage(result: JobResult, spec: JobSpec) -> CompletionUsage:
    u = result.usage
    prompt, completion = (u.prompt_tokens, u.completion_tokens) if u else (len(spec.prompt_ids), 0)
    cached = u.cached_tokens if u else 0
    return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion,
                           total_tokens=prompt + completion,
                           prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


def text_of(event: JobEvent) -> str:
    t = event.token
    return t.text if t is not None and not t.special else ""


def top_logprob(t: EventToken) -> TopLogprob:
    return TopLogprob(token=t.text, logprob=t.logprob if t.logprob is not None else 0.0,
                      bytes=list(t.text.encode()))


def chat_logprobs(events: list[JobEvent]) -> ChoiceLogprobs:
    return ChoiceLogprobs(content=[
        TokenLogprob(**top_logprob(e.token).model_dump(), top_logprobs=[top_logprob(t) for t in e.top_tokens])
        for e in events if e.token is not None and not e.token.special
    ])


def completion_logprobs(events: list[JobEvent], offset: int, echo: bool = False,
                         prompt: list[PromptEventToken] | None = None) -> CompletionLogprobs:
    """One entry per token that shows text, so `tokens` join to the choice's text. A token whose
    text is empty (the one completing a stop sequence, one held back for a stop sequence or only
    part of a character) has no entry: its text comes with a later token's. Usage still counts it.
    With `echo`, the echoed prompt's entries come first and every generated token has one (special
    ones too), as vLLM: a scorer (lm-evaluation-harness) counts entries by position."""
    out = CompletionLogprobs(top_logprobs=[])
    for e in events:
        if e.token is None or (not echo and (e.token.special or not e.token.text)):
            continue
        out.tokens.append(e.token.text)
        out.token_logprobs.append(e.token.logprob)
        out.top_logprobs.append({t.text: t.logprob or 0.0 for t in e.top_tokens})  # type: ignore[union-attr]
        out.text_offset.append(offset)
        offset += len(e.token.text)
    return joined(echo_logprobs(prompt_of(events) if prompt is None else prompt), out) if echo else out


def chat_choice(body: ChatCompletionRequest, i: int, c: ChoiceResult, events: list[JobEvent]) -> ChatChoice:
    """One choice of a chat answer: its text, or the tool calls parsed from it."""
    message, reason = AssistantMessage(content=c.generated_text), finish_reason(c)
    if tools.mode(body) != "none":
        parsed = tools.parse(body, c.generated_text, cut_off=reason == "length")
        message = AssistantMessage(content=parsed.content, tool_calls=parsed.tool_calls or None)
        reason = tools.finish_reason(bool(parsed.tool_calls), reason)
    return ChatChoice(index=i, message=message, logprobs=chat_logprobs(events) if body.logprobs else None,
                      finish_reason=reason)  # type: ignore[arg-type]


def summed_usage(parts: list[CompletionUsage]) -> CompletionUsage:
    """The usage of a request of several jobs (one per prompt): the sum of theirs."""
    cached = sum(p.prompt_tokens_details.cached_tokens for p in parts if p.prompt_tokens_details)
    return CompletionUsage(prompt_tokens=sum(p.prompt_tokens for p in parts),
                           completion_tokens=sum(p.completion_tokens for p in parts),
                           total_tokens=sum(p.total_tokens for p in parts),
                           prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


class ChunkWriter:
    """A stream's chunks (ChatCompletionChunk or Completion, one choice each) as JSON: the head, the
    same in every chunk, is written once; a chunk's model built and dumped per token was most of a
    streamed token's rendering. `usage` with include_usage: the field, null but where given."""

    def __init__(self, model: type[ChatCompletionChunk] | type[Completion], head: dict[str, Any],
                 include_usage: bool) -> None:
        self._opening = model(**head, choices=[]).model_dump_json(exclude={"usage"}).removesuffix("]}")
        self._include_usage = include_usage

    def __call__(self, choice: BaseModel, usage: CompletionUsage | None = None) -> str:
        shown = ""
        if self._include_usage:
            shown = ',"usage":' + (usage.model_dump_json(exclude_none=True) if usage else "null")
        return f"{self._opening}{choice.model_dump_json()}]{shown}}}"
