"""When each request is sent: offsets in seconds from the start of a run.

rate inf: all at once; fixed: every 1/rate s; poisson: exponential gaps of mean 1/rate (seeded,
numpy default_rng as vLLM's client). A fixed concurrency is a cap the runner holds on top of it.
"""

from __future__ import annotations

import math

import numpy as np

KINDS = ("poisson", "fixed")


def schedule(n: int, rate: float, kind: str = "poisson", seed: int = 0) -> list[float]:
    if rate <= 0:
        raise ValueError("--request-rate must be > 0 (inf: all at once)")
    if math.isinf(rate):
        return [0.0] * n
    if kind == "fixed":
        return [i / rate for i in range(n)]
    if kind != "poisson":
        raise ValueError(f"--arrival is one of {', '.join(KINDS)}, not {kind!r}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    gaps[0] = 0.0  # the first request goes at once
    return np.cumsum(gaps).tolist()


def parse_rate(text: str) -> float:
    value = float(text)  # float("inf") works
    if not value > 0:
        raise ValueError(f"a request rate is > 0 or inf, not {text!r}")
    return value
