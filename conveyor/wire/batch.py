"""OpenAI's Files and Batch API shapes (`/v1/files`, `/v1/batches`), and a batch input line.

Field names and values follow OpenAI's so that its clients parse them unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions"]
ENDPOINTS: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions")
BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired",
                      "cancelling", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
COMPLETION_WINDOW_S = {"24h": 86400}  # the only window OpenAI offers


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class BatchCreate(BaseModel):
    input_file_id: str = Field(max_length=200)
    endpoint: BatchEndpoint
    completion_window: str = Field(description='"24h", the only window offered')
    metadata: dict[str, str] | None = Field(default=None, max_length=16)


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError] = Field(default_factory=list)


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class BatchLine(BaseModel):
    """One line of an input file."""

    custom_id: str = Field(min_length=1, max_length=512)
    method: Literal["POST"]
    url: str
    body: dict[str, Any]


class LineError(BaseModel):
    """Why a line did not run: `code`, `message` (and, for a body the endpoint refused, the status
    and OpenAI error body that the endpoint would have answered)."""

    custom_id: str | None = None
    code: str
    message: str
    status_code: int | None = None
    body: dict[str, Any] | None = None


class LineResponse(BaseModel):
    status_code: int
    request_id: str | None = None
    body: dict[str, Any]


class LineErrorBody(BaseModel):
    code: str
    message: str


class OutputLine(BaseModel):
    """One line of an output or error file, in OpenAI's shape."""

    id: str
    custom_id: str | None
    response: LineResponse | None = None
    error: LineErrorBody | None = None
