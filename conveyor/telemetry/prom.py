"""Prometheus exposition shared by the roles: one registry per process part, TGI's exact names.

TGI exposes its counters without the `_total` suffix that prometheus_client adds (`tgi_request_count`,
not `tgi_request_count_total`); dashboards and alerts written for TGI query those names, so `render`
writes them as TGI does. `_created` series are off (TGI has none; they double the output).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.registry import Collector

TGI_COUNTERS = ("tgi_request_count", "tgi_request_success", "tgi_request_failure")
CONTENT_TYPE = CONTENT_TYPE_LATEST

disable_created_metrics()


def new_registry() -> CollectorRegistry:
    """A registry of its own (several workers may live in one test process), with the process's
    CPU, memory and GC metrics."""
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(_Forward(collector))
    return registry


class _Forward(Collector):
    """The default registry's process collectors, shown in another registry too."""

    def __init__(self, inner: Collector) -> None:
        self.inner = inner

    def collect(self):  # type: ignore[no-untyped-def]
        return self.inner.collect()


def render(registry: CollectorRegistry) -> bytes:
    text = generate_latest(registry).decode()
    for name in TGI_COUNTERS:
        text = text.replace(f"{name}_total", name)
    return text.encode()


Health = Callable[[], tuple[int, str]]  # (HTTP status, body) of /health


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    health: Health | None = None

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path == "/health" and self.health is not None:
            status, text = self.health()
            self._send(status, "text/plain; charset=utf-8", text.encode())
            return
        if path not in ("/metrics", "/"):
            self.send_error(404, "try /metrics")
            return
        self._send(200, CONTENT_TYPE, render(self.registry))

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - scrapes are not news
        return


def serve(registry: CollectorRegistry, host: str, port: int, setting: str,
          health: Health | None = None) -> ThreadingHTTPServer:
    """`/metrics` on host:port from a daemon thread (a worker's or webhook process's own port), and
    `/health` when given (a worker's liveness: conveyor/worker/liveness.py)."""
    handle_health = None if health is None else staticmethod(health)
    handler = type("MetricsHandler", (_Handler,), {"registry": registry, "health": handle_health})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        flag = "--" + setting.replace("_", "-")
        raise SystemExit(f"conveyor: cannot serve /metrics on {host}:{port} ({exc}): give {flag} a free "
                         "port, or 0 for no metrics endpoint") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
