"""The webhook process's Prometheus metrics, on its own port (`webhook_metrics_port`)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from conveyor.telemetry.prom import new_registry

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class DeliveryMetrics:
    def __init__(self) -> None:
        r = self.registry = new_registry()
        self.attempts = Counter("conveyor_webhook_deliveries", "Webhook delivery attempts by event and "
                                "outcome (delivered, retrying, failed, gone, refused)", ["event", "outcome"],
                                registry=r)
        self.seconds = Histogram("conveyor_webhook_attempt_duration_seconds", "Seconds per delivery attempt",
                                 buckets=SECONDS, registry=r)

    def attempt(self, event: str, outcome: str, seconds: float) -> None:
        self.attempts.labels(event, outcome).inc()
        self.seconds.observe(seconds)
