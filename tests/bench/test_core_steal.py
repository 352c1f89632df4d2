"""benchmarks/core_steal.py's pure parts: it reads benchmarks/engine.py's throughput line, and refuses a
duty cycle that is not one."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.core_steal import _TOTAL
from tests.conftest import REPO


def test_reads_the_engine_line_as_bench_engine_prints_it() -> None:
    for label, total in (("(c) conveyor engine", 586.84), ("(c) conveyor engine @4096", 1058.94)):
        line = f"{label:30s} total {total:7.1f} tok/s   output {total / 3:6.1f} tok/s   (41.9 s)"
        match = _TOTAL.search(f"fp32 matmul peak: 206 GFLOP/s\n{line}\n")
        assert match is not None and float(match.group(1)) == round(total, 1)


def test_refuses_more_on_time_than_its_period() -> None:
    done = subprocess.run([sys.executable, "benchmarks/core_steal.py", "--on-ms", "20", "--period-ms", "10"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--on-ms <= --period-ms" in done.stderr


def test_refuses_an_unknown_priority() -> None:
    done = subprocess.run([sys.executable, "benchmarks/core_steal.py", "--policies", "normal,realtime"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--policies takes normal, nice, idle" in done.stderr
