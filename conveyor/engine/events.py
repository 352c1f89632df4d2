"""What the engine hands back from each step: one event per sampled token or finish."""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.engine.sequence import FinishReason


@dataclass(slots=True, frozen=True)
class TopToken:
    id: int
    text: str
    logprob: float
    special: bool


@dataclass(slots=True, frozen=True)
class PromptToken:
    """One prompt token and its logprob under the model given the tokens before it (None for the
    first), with the top alternatives asked for (`SamplingParams.prompt_logprobs`)."""

    id: int
    text: str
    logprob: float | None
    top_tokens: list[TopToken] = field(default_factory=list)


@dataclass(slots=True)
class TokenEvent:
    """One generated token of one request, or the end of a request.

    `index` counts generated tokens from 0 (a resumed request continues its numbering), per choice.
    `text` is the UTF-8-safe piece of output this token releases: empty while a multi-byte
    character or a possible stop sequence is still incomplete; for a special token (e.g. EOS) it is
    the token's own text and `special` is true, and it is not part of `generated_text`.
    An event with `token_id is None` carries only a finish (aborted, expired) or held-back text.
    The last event of a request has `finish_reason` and `generated_text` (the whole output, without
    any stop sequence).
    `prompt_tokens`: the prompt's tokens and logprobs, on the request's first event (index 0) when
    it asked for prompt logprobs; a scoring-only request (max_new_tokens 0) has just that event.
    """

    request_id: str
    index: int
    token_id: int | None
    text: str = ""
    logprob: float | None = None
    special: bool = False
    top_tokens: list[TopToken] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    generated_text: str | None = None
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0
    seed: int | None = None
    prompt_tokens: list[PromptToken] | None = None
    choice: int = 0  # which of the request's sequences (OpenAI `n`, TGI `best_of`) this event is of
