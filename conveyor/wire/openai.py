"""OpenAI wire format: chat completions, completions, models, errors.

Field names and ranges follow OpenAI's API so its clients work unchanged. A few extensions that
vLLM and TGI also accept (`top_k`, `repetition_penalty`, `ignore_eos`) are marked as such.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

LOGIT_BIAS_MAX_ENTRIES = 300  # OpenAI's limit
LOGIT_BIAS_RANGE = 100.0  # a bias is in [-100, 100]


class _NullIsAbsent(BaseModel):
    """OpenAI's spec marks every optional field nullable: a `null` means "not given", so the
    field's default applies (text-generation's `Client.chat` sends `"n": null, "logprobs": null`)."""

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class StreamOptions(_NullIsAbsent):
    include_usage: bool = False
    continuous_usage_stats: bool = Field(default=False, description="Extension (vLLM's): with "
                                         "include_usage, every chunk carries the usage so far.")


class _Sampling(_NullIsAbsent):
    """Parameters common to chat completions and completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(default=None, description="The model to run, where several are configured "
                              "(docs/operations/multi-model.md); unset: the default; ignored with one.")
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description="0: greedy.")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, description="Choices, sharing the prompt's KV; at most max_best_of.")
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(
        default=None, max_length=LOGIT_BIAS_MAX_ENTRIES,
        description="Token id (a string) → bias in [-100, 100] added to its logit; at most 300 entries.")
    user: str | None = None
    # extensions (vLLM, TGI)
    top_k: int | None = Field(default=None, ge=-1, description="Extension; -1 or 0: off.")
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=100.0, description="Extension.")
    ignore_eos: bool = Field(default=False, description="Extension: generate max_tokens whatever the EOS.")
    speculate: bool = Field(default=True, description="Extension: false, no speculative decoding for this "
                            "request (where the server's `--speculate` is on).")

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if stop == "" or (isinstance(stop, list) and any(s == "" for s in stop)):
            raise ValueError("stop sequences must not be empty strings")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            if not key.strip().lstrip("-").isdigit():
                raise ValueError(f"keys are token ids (integers as strings); given {key!r}")
            if not -LOGIT_BIAS_RANGE <= value <= LOGIT_BIAS_RANGE:
                raise ValueError(f"token {key}: a bias must be in [-100, 100]; given {value}")
        return bias

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # validate_default: a message that leaves it out is checked as one that sends null.
    content: str | list[ContentPart] | None = Field(default=None, validate_default=True)
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content_needed(cls, content: str | list[ContentPart] | None, info: ValidationInfo) -> object:
        """As OpenAI: only an assistant message may go without content (its tool calls say it all),
        and a user's message must say something."""
        role = info.data.get("role")
        if content is None and role not in (None, "assistant"):
            raise ValueError(f"a {role} message needs content (a string or a list of parts)")
        if role == "user" and (content == "" or content == []):
            raise ValueError("a user message's content must not be empty")
        return content


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = Field(default=True, description="false: at most one tool call.")


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0, description="OpenAI's default: 16. 0 only with `echo`: "
                                   "score the prompt, generate nothing.")
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    response_format: ResponseFormat | None = Field(default=None, description="As vLLM: as in chat.")
    best_of: int | None = Field(default=None, ge=1, description="Sequences generated (>= n), of which the n "
                                "with the highest cumulative logprob are returned; not streamable.")


# --- responses ------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


OpenAIFinishReason = Literal["stop", "length", "tool_calls"]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    # {id, type: "function", function: {name, arguments: JSON text}} (conveyor/api/requests/tools.py);
    # absent if none
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: OpenAIFinishReason | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: CompletionUsage


class ChunkDelta(BaseModel):
    # In every chunk, as TGI: OpenAI's clients accept it, TGI's (text-generation) require it.
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: OpenAIFinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] | None = None  # null for an echoed prompt's first token
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: OpenAIFinishReason | None = None


class Completion(BaseModel):
    """A completion, or (streamed) one chunk of it: OpenAI uses one object type for both."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "conveyor"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class OpenAIError(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(BaseModel):
    error: OpenAIError
