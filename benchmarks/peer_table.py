"""benchmarks/peers.py's table: each system's figures on one workload, and each figure's ratio to a
base — for the peers, the midpoint of Conveyor's two runs (A-B-A: a, then the peers, then b, so a
drift that is linear in time cancels); for Conveyor's run b, run a (the drift within the sitting).
Throughput: higher is better; latency: lower is better."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# (label, summary key, percentile or None)
COLUMNS = [("total tok/s", "total_token_throughput", None), ("out tok/s", "output_throughput", None),
           ("TTFT p50 s", "ttft_ms", "p50"), ("TTFT p99 s", "ttft_ms", "p99"),
           ("TPOT p50 ms", "tpot_ms", "p50"), ("E2E p50 s", "e2el_ms", "p50")]


@dataclass(frozen=True)
class Row:
    name: str
    result: dict[str, Any] | str  # a run's summary, or why it did not run
    base: list[float] | None = None  # the figures its ratios are to (None: no ratios)


def values(r: dict[str, Any]) -> list[float]:
    """The row's figures, in the table's units (TTFT and E2E in s, TPOT in ms)."""
    out = []
    for _label, key, sub in COLUMNS:
        v = r[key][sub] if sub else r[key]
        v = math.nan if v is None else float(v)
        out.append(v / 1000 if sub and key != "tpot_ms" else v)
    return out


def midpoint(runs: Sequence[dict[str, Any]]) -> list[float] | None:
    """Each figure's mean over the runs (Conveyor's a and b); None without runs."""
    if not runs:
        return None
    rows = [values(r) for r in runs]
    return [sum(col) / len(col) for col in zip(*rows, strict=True)]


def _cell(v: float, base: float | None, wide: bool) -> str:
    text = f"{v:,.1f}" if wide else f"{v:.2f}"
    if base is not None and base and not math.isnan(v) and not math.isnan(base):
        text += f" ({v / base:.2f}×)"
    return text


def side_by_side(rows: Sequence[Row]) -> str:
    """A markdown table, one line per row."""
    lines = ["| system | ok / failed | " + " | ".join(c[0] for c in COLUMNS) + " | client CPU ms/req |",
             "|" + "---|" * (len(COLUMNS) + 3)]
    for row in rows:
        if isinstance(row.result, str):
            lines.append(f"| {row.name} | could not run: {row.result} |" + " |" * (len(COLUMNS) + 1))
            continue
        figures = values(row.result)
        cells = [_cell(v, row.base[i] if row.base else None, COLUMNS[i][1] in ("total_token_throughput",
                       "output_throughput", "tpot_ms")) for i, v in enumerate(figures)]
        cpu = row.result.get("client_cpu_ms_per_request")
        lines.append(f"| {row.name} | {row.result['completed']} / {row.result['failed']} | "
                     + " | ".join(cells) + f" | {'-' if cpu is None else f'{cpu:.1f}'} |")
    return "\n".join(lines)
