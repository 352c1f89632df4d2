"""PNG plots (matplotlib, the `bench` extra): latency CDFs of each run; throughput, TTFT and TPOT
against the swept rate or concurrency."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

INSTALL = "pip install 'conveyor[bench]'  (or: pip install matplotlib)"


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def cdfs(runs: list[dict[str, Any]], labels: list[str], out: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    pick = {"TTFT (s)": lambda r: r.ttft, "TPOT (ms)": lambda r: 1000 * r.tpot if r.tpot else None,
            "E2E latency (s)": lambda r: r.e2e}
    for ax, (title, value) in zip(axes, pick.items(), strict=True):
        for run, label in zip(runs, labels, strict=True):
            xs = sorted(v for r in run["_records"] if r.ok and (v := value(r)) is not None)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label)
        ax.set_xlabel(title)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = out / "latency_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep(runs: list[dict[str, Any]], xs: list[float], xlabel: str, out: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    finite = [x for x in xs if not math.isinf(x)] or [1.0]
    labels = ["inf" if math.isinf(x) else f"{x:g}" for x in xs]
    xs = [2 * max(finite) if math.isinf(x) else x for x in xs]  # "all at once" drawn right of the rest
    axes[0].plot(xs, [r["total_token_throughput"] for r in runs], "o-", label="total")
    axes[0].plot(xs, [r["output_throughput"] for r in runs], "o-", label="output")
    axes[0].set_ylabel("tokens/s")
    axes[0].legend()
    for q in ("p50", "p99"):
        axes[1].plot(xs, [r["ttft_ms"][q] / 1000 for r in runs], "o-", label=q)
        axes[2].plot(xs, [r["tpot_ms"][q] for r in runs], "o-", label=q)
    axes[1].set_ylabel("TTFT (s)")
    axes[2].set_ylabel("TPOT (ms)")
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.set_xticks(xs, labels)
        ax.grid(alpha=0.3)
    axes[1].legend()
    axes[2].legend()
    fig.tight_layout()
    path = out / "sweep.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
