"""benchmarks/overhead.py's report: the legs side by side, full/engine ratios, and where the full
stack's time and CPU went (markdown)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

WORKER_PARTS = ("worker main thread",)  # split out of "worker", which stays the whole process


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def cpu_rows(cpu: dict[str, float]) -> list[tuple[str, float]]:
    """The worker split into its main thread and the rest; then every other process; the total."""
    rows = []
    worker, main = cpu.get("worker", 0.0), cpu.get("worker main thread", 0.0)
    if "worker" in cpu:
        rows += [("worker: engine thread + OpenMP pool (+ small threads)", worker - main),
                 ("worker: main thread (asyncio: jobs in, tokens out to Redis)", main)]
    rows += [(name, v) for name, v in sorted(cpu.items(), key=lambda kv: -kv[1])
             if name != "worker" and name not in WORKER_PARTS]
    rows.append(("total", sum(v for name, v in cpu.items() if name not in WORKER_PARTS)))
    return rows


def bracketed(legs: Sequence[tuple[str, dict[str, Any]]]) -> list[float]:
    """full / engine for each full leg run between two engine legs, to the mean of those two: the
    machine's drift over a sitting (10 % and more here) then cancels to first order."""
    tps = [(name.startswith("full"), r["total_token_throughput"]) for name, r in legs]
    return [t / ((tps[i - 1][1] + tps[i + 1][1]) / 2) for i, (full, t) in enumerate(tps)
            if full and 0 < i < len(tps) - 1 and not tps[i - 1][0] and not tps[i + 1][0]]


def report(legs: Sequence[tuple[str, dict[str, Any]]], workload: str, n: int) -> str:
    engines = [r for name, r in legs if name.startswith("engine")]
    fulls = [(name, r) for name, r in legs if name.startswith("full")]
    engine_tps = _mean([r["total_token_throughput"] for r in engines])
    engine_s = _mean([r["duration_s"] for r in engines])
    engine_step = _mean([r["step_s"] for r in engines])
    lines = [f"### Full stack vs engine alone: {workload}, {n} requests at once", "",
             "| leg | total tok/s | duration s | engine steps | in steps s | outside steps s | CPU s |",
             "|---|---|---|---|---|---|---|"]
    for name, r in legs:
        cpu = r["cpu_s"] if isinstance(r["cpu_s"], float) else cpu_rows(r["cpu_s"])[-1][1]
        ratio = f" ({r['total_token_throughput'] / engine_tps:.3f}× engine)" if name.startswith("full") \
            and engines else ""
        lines.append(f"| {name} | {r['total_token_throughput']:,.1f}{ratio} | {r['duration_s']:.2f} | "
                     f"{r['steps']} | {r['step_s']:.2f} | {r['duration_s'] - r['step_s']:.2f} | {cpu:.2f} |")
    if len(engines) > 1:
        lines.append(f"\nEngine drift within the sitting (last / first leg): "
                     f"{engines[-1]['total_token_throughput'] / engines[0]['total_token_throughput']:.3f}×.")
    ratios = sorted(bracketed(legs))
    if ratios:
        median = statistics.median(ratios)
        lines.append(f"\n**full / engine, each full leg to the engine legs on either side of it: "
                     f"{median:.3f}** (median of {len(ratios)}; {', '.join(f'{x:.3f}' for x in ratios)}).")
    for name, r in fulls:
        if engines:
            extra = r["duration_s"] - engine_s
            lines += ["", f"**{name}: full / engine = {r['total_token_throughput'] / engine_tps:.3f}** "
                      f"(total tok/s, to the engine legs' mean). Its run took {extra:+.2f} s against the "
                      f"engine alone's: its engine steps {r['step_s'] - engine_step:+.2f} s (the same "
                      "steps, slower: they share the cores with the processes below), and time with no "
                      f"step running {(r['duration_s'] - r['step_s']) - (engine_s - engine_step):+.2f} s "
                      "(waiting for jobs to arrive, for the client to read, between steps)."]
        lines += ["", f"CPU seconds over {name}'s {r['duration_s']:.1f} s run (2 cores: "
                  f"{2 * r['duration_s']:.1f} CPU-s available):", "",
                  "| process | CPU s | share of one core |", "|---|---|---|"]
        lines += [f"| {proc} | {v:.2f} | {100 * v / r['duration_s']:.1f} % |"
                  for proc, v in cpu_rows(r["cpu_s"])]
    if engines:
        lines.append(f"\nThe engine alone used {_mean([r['cpu_s'] for r in engines]):.2f} CPU s "
                     f"over {engine_s:.1f} s (mean of its legs).")
    return "\n".join(lines)
