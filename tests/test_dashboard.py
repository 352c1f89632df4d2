"""deploy/grafana/conveyor.json queries only metrics that the api, the workers and the webhook
processes export (under the names they render), so no panel is silently empty."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conveyor.api.metrics import ApiMetrics
from conveyor.telemetry.prom import render
from conveyor.webhooks.metrics import DeliveryMetrics
from conveyor.wire.heartbeat import EngineLoad
from conveyor.worker.metrics import WorkerMetrics

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "conveyor.json"


def exported() -> set[str]:
    stats = EngineLoad(blocks_free=8)
    names: set[str] = set()
    for registry in (ApiMetrics().registry, WorkerMetrics(lambda: stats, lambda: 0, 16, "m").registry,
                     DeliveryMetrics().registry):
        for line in render(registry).decode().splitlines():
            if line.startswith("# TYPE "):
                name, kind = line.split()[2:4]
                parts = ("bucket", "sum", "count") if kind == "histogram" else ("",)
                names |= {f"{name}_{p}".rstrip("_") for p in parts}
    return names


def test_every_dashboard_query_names_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names = exported()
    queried = {m for panel in dashboard["panels"] for target in panel["targets"]
               for m in re.findall(r"\b(?:tgi|conveyor)_[a-z_]+\b", target["expr"])}
    assert len(dashboard["panels"]) >= 10 and len(queried) >= 20
    assert queried <= names, sorted(queried - names)
    for must in ("tgi_request_count", "tgi_request_success", "tgi_request_failure",
                 "conveyor_time_to_first_token_seconds_bucket",
                 "tgi_request_mean_time_per_token_duration_bucket"):
        assert must in names
