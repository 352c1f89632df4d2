"""The async job API (`/v1/jobs`): a generate, chat or completion body plus job options."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, ValidationInfo, field_validator

from conveyor.wire.job import (
    JobKind,
    JobResult,
    JobSpec,
    JobStatus,
    RecordField,
    Webhook,
    WebhookDelivery,
    webhook_field,
)
from conveyor.wire.openai import ChatCompletionRequest, CompletionRequest
from conveyor.wire.tgi import GenerateRequest

MAX_TTL_S = 7 * 86400


class JobOptions(BaseModel):
    webhook: Webhook | None = None
    priority: int = Field(default=0, ge=-100, le=100, description="Higher is served first.")
    deadline: datetime | None = Field(
        default=None,
        description="Epoch seconds or ISO 8601 (UTC unless it says otherwise); a job still queued then "
        "ends `expired`.",
    )
    ttl: float | None = Field(default=None, gt=0, le=MAX_TTL_S, description="Seconds from now: a deadline.")

    @field_validator("ttl")
    @classmethod
    def _one_deadline(cls, ttl: float | None, info: ValidationInfo) -> float | None:
        if ttl is not None and info.data.get("deadline") is not None:
            raise ValueError("give `deadline` or `ttl`, not both")
        return ttl

    def deadline_epoch(self, now: float) -> float | None:
        if self.ttl is not None:
            return now + self.ttl
        if self.deadline is None:
            return None
        deadline = self.deadline if self.deadline.tzinfo else self.deadline.replace(tzinfo=UTC)
        return deadline.timestamp()


class GenerateJob(GenerateRequest, JobOptions):
    """TGI `/generate` body."""


class ChatJob(ChatCompletionRequest, JobOptions):
    """OpenAI `/v1/chat/completions` body (`stream` is ignored: follow `/events`)."""


class CompletionJob(CompletionRequest, JobOptions):
    """OpenAI `/v1/completions` body (`stream` is ignored: follow `/events`)."""


def _kind(body: Any) -> str:
    if isinstance(body, dict):
        if "messages" in body:
            return "chat"
        if "prompt" in body:
            return "completion"
    return "generate"


JobRequest = Annotated[
    Annotated[GenerateJob, Tag("generate")] | Annotated[ChatJob, Tag("chat")]
    | Annotated[CompletionJob, Tag("completion")],
    Discriminator(_kind),
]


class JobUrls(BaseModel):
    self: str
    events: str
    cancel: str

    @classmethod
    def of(cls, job_id: str) -> JobUrls:
        return cls(self=f"/v1/jobs/{job_id}", events=f"/v1/jobs/{job_id}/events", cancel=f"/v1/jobs/{job_id}")


class JobAccepted(BaseModel):
    id: str
    object: Literal["job"] = "job"
    status: JobStatus
    urls: JobUrls


class JobView(BaseModel):
    id: str
    object: Literal["job"] = "job"
    kind: JobKind
    status: JobStatus
    created_at: float
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    cancel_requested: bool = False
    priority: int = 0
    deadline: float | None = None
    webhook: Webhook | None = None
    webhook_deliveries: list[WebhookDelivery] = Field(
        default_factory=list, description="Each webhook's state and attempts (time, status code or error).")
    result: JobResult | None = None
    urls: JobUrls

    @classmethod
    def from_record(cls, job_id: str, record: dict[str, str]) -> JobView:
        """The job as the api shows it (and as a webhook sends it), from its record hash."""
        spec = JobSpec.model_validate_json(record[RecordField.SPEC])

        def number(field: RecordField) -> float | None:
            value = record.get(field)
            return float(value) if value else None

        result = record.get(RecordField.RESULT)
        deliveries = [WebhookDelivery.model_validate_json(record[f]) for f in
                      (webhook_field("started"), webhook_field("completed")) if record.get(f)]
        return cls(
            id=job_id, kind=spec.kind, status=JobStatus(record[RecordField.STATUS]),
            created_at=spec.created_at, started_at=number(RecordField.STARTED_AT),
            first_token_at=number(RecordField.FIRST_TOKEN_AT), finished_at=number(RecordField.FINISHED_AT),
            cancel_requested=RecordField.CANCEL in record, priority=spec.priority, deadline=spec.deadline,
            webhook=spec.webhook, webhook_deliveries=deliveries,
            result=JobResult.model_validate_json(result) if result else None, urls=JobUrls.of(job_id),
        )


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobView]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
