"""OpenTelemetry traces of a job's path, when `otlp_endpoint` is set; nothing at all when it is not.

Off (the default) there is no `Tracing` object: callers hold None, OpenTelemetry is never imported,
and a job carries no trace context. On, one trace per request:

  POST /generate (api span, the whole HTTP request)
    └ conveyor.queue          created → a worker started it
    └ conveyor.worker.job     started → final record (worker id, tokens, status)
        ├ conveyor.engine.prefill   started → first token
        └ conveyor.engine.decode    first token → last

The api's span context travels in `JobSpec.traceparent` (W3C). The worker writes its spans when the
job ends, with the job's own timestamps, so tracing costs the engine's steps nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conveyor.settings import Settings

log = logging.getLogger(__name__)


def _ns(t: float) -> int:
    return int(t * 1e9)


class Tracing:
    def __init__(self, provider: Any, propagator: Any) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("conveyor")
        self.propagator = propagator

    @classmethod
    def from_settings(cls, settings: Settings, service: str) -> Tracing | None:
        if not settings.otlp_endpoint:
            return None
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as exc:
            raise SystemExit(f"conveyor: otlp_endpoint is set but OpenTelemetry is not installed ({exc}): "
                             "pip install 'conveyor[otel]', or unset otlp_endpoint") from None
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        endpoint = settings.otlp_endpoint.rstrip("/") + "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        log.info("tracing on: spans go to %s", endpoint)
        return cls(provider, TraceContextTextMapPropagator())

    def shutdown(self) -> None:
        """Sends what is buffered."""
        self.provider.shutdown()

    @contextmanager
    def request(self, name: str, **attributes: str) -> Iterator[None]:
        """The api's span around one HTTP request; current while the route runs."""
        with self.tracer.start_as_current_span(name, attributes=attributes):
            yield

    def tag(self, **attributes: str) -> None:
        """Attributes on the current span (the api's request span: the job id once it has one)."""
        from opentelemetry import trace

        trace.get_current_span().set_attributes(attributes)

    def traceparent(self) -> str | None:
        """The current span's context as a W3C traceparent, to hand to the worker."""
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier)
        return carrier.get("traceparent")

    def job(self, traceparent: str | None, attributes: dict[str, Any], created: float,
            started: float | None, first_token: float | None, finished: float) -> None:
        """The worker's spans of one job, from its timestamps (epoch seconds)."""
        from opentelemetry import trace

        parent = self.propagator.extract({"traceparent": traceparent} if traceparent else {})
        queue_end = started if started is not None else finished
        self.tracer.start_span("conveyor.queue", context=parent, start_time=_ns(created),
                               attributes={"conveyor.job_id": attributes.get("conveyor.job_id", "")}
                               ).end(end_time=_ns(queue_end))
        if started is None:
            return
        span = self.tracer.start_span("conveyor.worker.job", context=parent, start_time=_ns(started),
                                      attributes=attributes)
        inside = trace.set_span_in_context(span, parent)
        if first_token is not None:
            self.tracer.start_span("conveyor.engine.prefill", context=inside, start_time=_ns(started)
                                   ).end(end_time=_ns(first_token))
            self.tracer.start_span("conveyor.engine.decode", context=inside, start_time=_ns(first_token)
                                   ).end(end_time=_ns(finished))
        span.end(end_time=_ns(finished))
