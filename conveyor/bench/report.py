"""A run's figures for people (a table) and for machines (JSON, without the per-request records)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def public(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if not k.startswith("_")}


def _num(x: Any, digits: int = 1) -> str:
    if x is None or isinstance(x, float) and math.isnan(x):
        return "-"
    return f"{x:,.{digits}f}" if isinstance(x, float) else str(x)


def table(summary: dict[str, Any], title: str = "") -> str:
    s = summary
    c = s.get("config", {})
    rows = [
        f"============ {title or 'conveyor bench'} ============",
        f"backend {c.get('backend')}{'/' + c['jobs_mode'] if c.get('jobs_mode') else ''}"
        f"   rate {c.get('rate')}"
        f" ({c.get('arrival')})   max concurrency {c.get('max_concurrency') or '-'}",
        f"{'requests completed / failed':<36}{s['completed']} / {s['failed']}",
    ]
    rows += [f"{'  errors ' + kind:<36}{n}" for kind, n in s["errors"].items()]
    rows += [
        f"{'duration (s)':<36}{_num(s['duration_s'], 2)}",
        f"{'input / output tokens':<36}{s['input_tokens']} / {s['output_tokens']}",
        f"{'request throughput (req/s)':<36}{_num(s['request_throughput'], 2)}",
        f"{'output token throughput (tok/s)':<36}{_num(s['output_throughput'])}",
        f"{'total token throughput (tok/s)':<36}{_num(s['total_token_throughput'])}",
    ]
    if "goodput" in s:
        slo = ",".join(f"{k}<={v:g}ms" for k, v in s["slo"].items())
        rows.append(f"{'goodput (req/s, ' + slo + ')':<35} {_num(s['goodput'], 2)}"
                    f"  ({s['good_requests']} of {s['requests']})")
    rows.append(f"{'(ms)':<14}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    names = [("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2el_ms"),
             ("webhook", "webhook_latency_ms")]
    for label, key in names:
        if key in s:
            d = s[key]
            rows.append(f"{label:<14}" + "".join(f"{_num(d[k]):>10}" for k in ("mean", "p50", "p90", "p99")))
    if "client_cpu_s" in s:
        rows.append(f"{'client CPU (s) / per request (ms)':<36}{_num(s['client_cpu_s'], 2)} / "
                    f"{_num(s['client_cpu_ms_per_request'], 2)}")
    return "\n".join(rows)


def write_json(runs: list[dict[str, Any]], path: Path, workload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"workload": workload, "runs": [public(r) for r in runs]}, indent=2,
                               default=str) + "\n")
