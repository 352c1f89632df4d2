"""The figures of one run from its records: throughput, latency distributions, errors, goodput.

Percentiles interpolate linearly between order statistics (numpy's default, as vLLM's client).
TTFT, TPOT, ITL and E2E are reported in milliseconds; goodput counts requests per second that
met every SLO given (vLLM's --goodput: ttft, tpot, e2el)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from conveyor.bench.record import Record

PERCENTILES = (50, 90, 99)
SLO_METRICS = ("ttft", "tpot", "e2el")
_UNITS = {"ms": 1e-3, "s": 1.0, "": 1e-3}  # a bare number is milliseconds (as vLLM's --goodput)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def distribution(seconds: Sequence[float]) -> dict[str, float]:
    """mean and percentiles, in ms."""
    ms = [1000 * v for v in seconds]
    out = {"mean": sum(ms) / len(ms) if ms else math.nan}
    out.update({f"p{q}": percentile(ms, q) for q in PERCENTILES})
    return out


def parse_slo(text: str | None) -> dict[str, float]:
    """"ttft=2s,tpot=200ms" → {"ttft": 2.0, "tpot": 0.2} (seconds)."""
    slo: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, _, value = part.partition("=")
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|)\s*", value)
        if name.strip() not in SLO_METRICS or match is None:
            raise ValueError(f"--slo takes NAME=VALUE[ms|s] with NAME in {', '.join(SLO_METRICS)}, "
                             f"e.g. ttft=2s,tpot=200ms; not {part!r}")
        slo[name.strip()] = float(match.group(1)) * _UNITS[match.group(2)]
    return slo


def meets(rec: Record, slo: dict[str, float]) -> bool:
    values = {"ttft": rec.ttft, "tpot": rec.tpot, "e2el": rec.e2e}
    if not rec.ok:
        return False
    for name, limit in slo.items():
        value = values[name]
        if value is None and name == "tpot" and rec.output_tokens < 2:
            continue  # one output token has no TPOT: it cannot miss that SLO
        if value is None or value > limit:  # not measured (e.g. TTFT when polling) is not met
            return False
    return True


def summarize(records: Sequence[Record], duration_s: float, slo: dict[str, float] | None = None,
              client_cpu_s: float | None = None) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    inputs = sum(r.prompt_tokens for r in ok)
    outputs = sum(r.output_tokens for r in ok)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: math.nan)
    out: dict[str, Any] = {
        "requests": len(records), "completed": len(ok), "failed": len(records) - len(ok),
        "errors": dict(Counter(r.error or "unknown" for r in records if not r.ok)),
        "duration_s": duration_s, "input_tokens": inputs, "output_tokens": outputs,
        "request_throughput": per_s(len(ok)), "output_throughput": per_s(outputs),
        "total_token_throughput": per_s(inputs + outputs),
        "ttft_ms": distribution([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": distribution([t for r in ok if (t := r.tpot) is not None]),
        "itl_ms": distribution([g for r in ok for g in r.itl]),
        "e2el_ms": distribution([r.e2e for r in ok if r.e2e is not None]),
    }
    hooks = [r.webhook_latency for r in ok if r.webhook_latency is not None]
    if hooks:
        out["webhook_latency_ms"] = distribution(hooks)
    if slo:
        good = sum(meets(r, slo) for r in records)
        out["slo"] = {k: v * 1000 for k, v in slo.items()}  # ms
        out["goodput"] = per_s(good)
        out["good_requests"] = good
    if client_cpu_s is not None:
        out["client_cpu_s"] = client_cpu_s
        out["client_cpu_ms_per_request"] = 1000 * client_cpu_s / len(records) if records else math.nan
    examples = {r.error: r.detail for r in records if not r.ok}
    if examples:
        out["error_examples"] = examples
    return out
