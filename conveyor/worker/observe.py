"""What a job's milestones set off besides the Redis writes: metrics, a log line, its webhook, its
trace spans. Called on the worker's asyncio loop right after the write (the `started` milestone
after a job is first taken, `ended` after its final record); nothing here waits on I/O: the webhook
goes to RQ from a thread of its own, spans to the exporter's own thread.
"""

from __future__ import annotations

import logging

from conveyor.telemetry.tracing import Tracing
from conveyor.webhooks.enqueue import WebhookQueue
from conveyor.wire.job import JobResult, JobSpec
from conveyor.worker.metrics import WorkerMetrics
from conveyor.worker.owned import InFlight

log = logging.getLogger("worker.jobs")


class Observer:
    def __init__(self, worker_id: str, metrics: WorkerMetrics, webhooks: WebhookQueue | None,
                 tracing: Tracing | None) -> None:
        self.worker_id = worker_id
        self.metrics = metrics
        self.webhooks = webhooks
        self.tracing = tracing

    def started(self, job: InFlight, spec: JobSpec) -> None:
        """A job's first start (not a resume)."""
        log.info("job %s started", job.job_id, extra={"job_id": job.job_id, "tenant": spec.tenant})
        self._notify(spec, "started")

    def ended(self, job: InFlight, result: JobResult) -> None:
        spec = job.spec
        tenant = spec.tenant if spec is not None else None
        self.metrics.ended(result)
        t = result.timings
        usage = result.usage
        log.info("job %s %s: %d tokens in %.3fs%s", job.job_id, result.status.value,
                 usage.completion_tokens if usage else 0, t.total_s if t else 0.0,
                 f" ({result.error})" if result.error else "",
                 extra={"job_id": job.job_id, "tenant": tenant})
        if spec is None:
            return
        self._notify(spec, "completed")
        if self.tracing is not None and t is not None:
            self.tracing.job(
                spec.traceparent,
                {"conveyor.job_id": job.job_id, "conveyor.tenant": spec.tenant,
                 "conveyor.worker_id": self.worker_id, "conveyor.status": result.status.value,
                 "conveyor.prompt_tokens": len(spec.prompt_ids),
                 "conveyor.generated_tokens": usage.completion_tokens if usage else 0},
                created=job.created_at, started=job.started_at, first_token=job.first_token_at,
                finished=job.created_at + t.total_s,
            )

    def dead_lettered(self) -> None:
        self.metrics.dead_lettered.inc()

    def reclaimed(self, count: int) -> None:
        self.metrics.reclaimed.inc(count)

    def _notify(self, spec: JobSpec, event: str) -> None:
        if self.webhooks is None or spec.webhook is None or event not in spec.webhook.events:
            return
        self.metrics.webhooks.labels(event).inc()
        self.webhooks.notify(spec, event)  # type: ignore[arg-type]
