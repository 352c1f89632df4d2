"""Text Generation Inference (TGI) wire format: requests, responses, stream events, errors.

Field names, ranges and error shapes follow TGI's router so its clients work unchanged.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class GenerateParameters(BaseModel):
    model_config = ConfigDict(extra="ignore")

    best_of: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, gt=0.0, le=100.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=100.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    top_k: int | None = Field(default=None, gt=0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    typical_p: float | None = Field(default=None, gt=0.0, le=1.0)
    do_sample: bool = False
    max_new_tokens: int | None = Field(default=None, gt=0)
    return_full_text: bool | None = None
    stop: list[str] = Field(default_factory=list)
    truncate: int | None = Field(default=None, gt=0)
    watermark: bool = False
    details: bool = False
    decoder_input_details: bool = False
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    top_n_tokens: int | None = Field(default=None, ge=0)
    # {"type": "json" | "regex" | "json_schema", "value": ...} (conveyor/api/requests/grammar.py)
    grammar: dict | None = None
    # TGI accepts it; Conveyor rejects it with a message instead of ignoring it.
    adapter_id: str | None = None
    # Conveyor's: false turns speculative decoding (the server's --speculate) off for this request.
    speculate: bool = True

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stop: list[str]) -> list[str]:
        if any(s == "" for s in stop):
            raise ValueError("stop sequences must not be empty strings")
        return stop

    @property
    def samples(self) -> bool:
        """TGI samples when asked to, or when any sampling warper is set."""
        return (
            self.do_sample
            or (self.temperature is not None and self.temperature != 1.0)
            or self.top_k is not None
            or (self.top_p is not None and self.top_p < 1.0)
            or (self.typical_p is not None and self.typical_p < 1.0)
        )


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    inputs: str = Field(min_length=1)
    parameters: GenerateParameters = Field(default_factory=GenerateParameters)


class CompatGenerateRequest(GenerateRequest):
    """`POST /`: TGI's route that streams when `stream` is true."""

    stream: bool = False


class Token(BaseModel):
    id: int
    text: str
    logprob: float | None = None
    special: bool = False


FinishReason = Literal["length", "eos_token", "stop_sequence"]


class StreamDetails(BaseModel):
    finish_reason: FinishReason
    generated_tokens: int
    seed: int | None = None
    input_length: int


class StreamResponse(BaseModel):
    index: int
    token: Token
    top_tokens: list[Token] = Field(default_factory=list)
    generated_text: str | None = None
    details: StreamDetails | None = None


class PrefillToken(BaseModel):
    id: int
    text: str
    logprob: float | None = None


class SequenceDetails(BaseModel):
    """What TGI reports of one generated sequence, in `details` and in each `best_of_sequences`."""

    finish_reason: FinishReason
    generated_tokens: int
    seed: int | None = None
    prefill: list[PrefillToken] = Field(default_factory=list)
    tokens: list[Token] = Field(default_factory=list)
    top_tokens: list[list[Token]] = Field(default_factory=list)


class BestOfSequence(SequenceDetails):
    """One of the other sequences of a `best_of` request (TGI's shape)."""

    generated_text: str


class Details(SequenceDetails):
    best_of_sequences: list[BestOfSequence] | None = None  # with best_of > 1: the others


class GenerateResponse(BaseModel):
    generated_text: str
    details: Details | None = None


ErrorType = Literal["validation", "overloaded", "generation", "incomplete_generation", "unauthorized",
                    "not_found", "unavailable", "internal"]


class ErrorResponse(BaseModel):
    error: str
    error_type: ErrorType


class Info(BaseModel):
    """`GET /info`, TGI's shape."""

    model_id: str
    model_sha: str | None = None
    model_dtype: str
    model_device_type: str
    model_pipeline_tag: str | None = "text-generation"
    max_concurrent_requests: int
    max_best_of: int
    max_stop_sequences: int
    max_input_tokens: int
    max_total_tokens: int
    max_top_n_tokens: int
    max_batch_prefill_tokens: int
    max_batch_total_tokens: int | None = None
    max_batch_size: int | None = None
    max_waiting_tokens: int
    waiting_served_ratio: float
    validation_workers: int = 1
    max_client_batch_size: int = 1
    router: str = "conveyor"
    version: str
    sha: str | None = None
    docker_label: str | None = None
