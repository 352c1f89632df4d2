"""The api's Prometheus metrics (`GET /metrics` of the api) and the middleware that counts requests.

The api knows requests: how many generation requests came in (`tgi_request_count`, every dialect and
`/v1/jobs`), which it refused before a job existed (`tgi_request_failure{err=validation|unauthorized|
overloaded|unavailable}`, the last while Redis does not answer) or ended in the queue
(`{err=cancelled|expired}`), how long each HTTP request took, the fleet's queue (read from Redis at
scrape time, each configured model's: `model` takes only the configured names, so its series stay
bounded) and its own relay (clients, lag). What happens to a job once a worker has it is the
worker's to count (conveyor/worker/metrics.py).
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.jobqueue.depth import QueuePlace
from conveyor.telemetry.prom import new_registry
from conveyor.telemetry.tracing import Tracing
from conveyor.wire.job import JobStatus

GENERATION_ROUTES = frozenset({"/generate", "/generate_stream", "/", "/v1/chat/completions",
                               "/v1/completions", "/v1/jobs"})
REFUSED = {400: "validation", 413: "validation", 422: "validation", 401: "unauthorized", 429: "overloaded",
           503: "unavailable"}
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
LAG_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1,
               2.5)


class ApiMetrics:
    def __init__(self) -> None:
        r = self.registry = new_registry()
        self.requests = Counter("tgi_request_count", "Generation requests received (TGI, OpenAI, /v1/jobs)",
                                registry=r)
        self.failure = Counter("tgi_request_failure", "Requests refused before a job existed (validation, "
                               "unauthorized, overloaded, unavailable) or jobs ended in the queue "
                               "(cancelled, expired)",
                               ["err"], registry=r)
        self.http_duration = Histogram("conveyor_http_request_duration_seconds", "Seconds from a generation "
                                       "request's arrival to the last byte of its answer", ["route"],
                                       buckets=SECONDS, registry=r)
        self.jobs = Gauge("conveyor_jobs", "Jobs in each model's queue by status (queued: not yet read by a "
                          "worker; running: read, not yet acknowledged)", ["model", "status"], registry=r)
        self.queue = Gauge("conveyor_queue_jobs", "Jobs in each place of each model's queue by status: a "
                           "shard's priority band, or its workers' own streams (band=own); conveyor_jobs "
                           "is their sum per model",
                           ["model", "shard", "band", "status"], registry=r)
        self.finished = Counter("conveyor_jobs_finished", "Jobs the api ended in the queue, by status",
                                ["status"], registry=r)
        self.sse_clients = Gauge("conveyor_sse_clients", "Clients following a job's events through this "
                                 "api (SSE streams, and sync requests waiting on their job)", registry=r)
        self.relay_lag = Histogram("conveyor_relay_lag_seconds", "Seconds from the engine emitting a token "
                                   "(the worker's stamp) to this api's relay receiving it: the stream "
                                   "interval, the worker's write and the pub/sub hop",
                                   buckets=LAG_SECONDS, registry=r)
        self.webhooks = Counter("conveyor_webhooks_enqueued", "Webhooks handed to the webhook queue (jobs "
                                "the api ended)", ["event"], registry=r)
        self.batches = Counter("conveyor_batches", "Batches that reached each status (validating, "
                               "in_progress, finalizing, completed, failed, expired, cancelling, "
                               "cancelled), counted by the api process that moved them", ["status"],
                               registry=r)
        self.batch_lines = Counter("conveyor_batch_lines", "Batch lines reported, by outcome (completed, "
                                   "failed, expired, cancelled)", ["outcome"], registry=r)

    def set_queue(self, by_model: dict[str, list[QueuePlace]] | None) -> None:
        """The queue's gauges from a scrape's reading (model name → its places), per stream and summed
        per model; none when unknown. Cleared first: a stream or worker gone leaves no stale series."""
        self.jobs.clear()
        self.queue.clear()
        if by_model is None:
            return
        for model, places in by_model.items():
            self.jobs.labels(model, "queued").set(sum(p.queued for p in places))
            self.jobs.labels(model, "running").set(sum(p.running for p in places))
            for p in places:
                self.queue.labels(model, str(p.shard), p.band, "queued").set(p.queued)
                self.queue.labels(model, str(p.shard), p.band, "running").set(p.running)

    def ended_in_queue(self, status: JobStatus) -> None:
        self.finished.labels(status.value).inc()
        self.failure.labels(status.value).inc()


class RequestMetrics:
    """ASGI middleware on generation routes: count, refusals by status, duration; the api's span."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics, tracing: Tracing | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") != "POST" or path not in GENERATION_ROUTES:
            await self.app(scope, receive, send)
            return
        self.metrics.requests.inc()
        started = time.perf_counter()
        status: dict[str, Any] = {}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if self.tracing is None:
                await self.app(scope, receive, watch)
            else:
                with self.tracing.request(f"POST {path}", **{"http.route": path}):
                    await self.app(scope, receive, watch)
        finally:
            err = REFUSED.get(status.get("code", 0))
            if err is not None:
                self.metrics.failure.labels(err).inc()
            self.metrics.http_duration.labels(path).observe(time.perf_counter() - started)
