"""The GPU check's kernel table (issue 43): what one pure-decode step launches and where its device
time goes, from torch.profiler over a few eager steps (eager: under a CUDA graph the profiler sees one
graph launch, not its kernels). On CPU (the check's smoke run) the same table of CPU operators."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu_speed import _sequences
from conveyor.engine.model_runner import ModelRunner
from conveyor.engine.step_plan import ScheduledChunk


def kernel_table(runner: ModelRunner, batch: int, context: int, log: Callable[[str], None],
                 steps: int = 3, top: int = 25) -> dict[str, Any]:
    """Per step: the `top` heaviest kernels (on CPU, operators) with their calls and self time, and
    the totals: device (CPU) time and, on CUDA, kernel launches."""
    cuda = runner.device.type == "cuda"
    seqs = _sequences(runner, batch, context + 1, seed=batch)
    chunks = [ScheduledChunk(s, context, 1) for s in seqs]
    graphs, runner.graphs = runner.graphs, None
    try:
        runner.execute(chunks)  # warm: the first eager step may still compile or allocate
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        with profile(activities=activities) as prof:
            for _ in range(steps):
                runner.execute(chunks)
            if cuda:
                torch.cuda.synchronize()
    finally:
        runner.graphs = graphs
    # On CUDA a kernel is an event with device time of its own; on CPU every operator is a row.
    time_of = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    rows = sorted((e for e in prof.key_averages() if time_of(e) > 0), key=time_of, reverse=True)
    total_us = sum(time_of(e) for e in rows) / steps
    kernels = [
        {"name": e.key[:120], "calls_per_step": e.count / steps, "us_per_step": time_of(e) / steps,
         "share": time_of(e) / steps / total_us if total_us else 0.0}
        for e in rows[:top]
    ]
    out = {
        "batch": batch,
        "context": context + 1,
        "clock": "device" if cuda else "cpu",
        "us_per_step": total_us,
        "launches_per_step": sum(e.count for e in rows) / steps if cuda else None,
        "kernels": kernels,
    }
    heaviest = ", ".join(f"{k['name'][:40]} {k['share']:.0%}" for k in kernels[:3])
    launches = "" if out["launches_per_step"] is None else f", {out['launches_per_step']:.0f} launches"
    log(f"kernels, decode batch {batch}: {total_us / 1e3:.2f} ms {out['clock']} time per step{launches}; "
        f"heaviest {heaviest}")
    return out
