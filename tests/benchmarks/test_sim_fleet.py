"""benchmarks/sim_fleet.py end to end, small: the api, a simulated worker and streaming clients on one
Redis node (TGI's stream) and on a 3-primary cluster (OpenAI's); every token streamed arrives (the
bench exits 1 otherwise) and the table has Redis's counts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


def run_sim_fleet(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.sim_fleet", "--workers", "1", "--clients", "2", "--jobs", "2",
         "--tokens", "8", "--step-ms", "5", *args],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 1, done.stdout
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def test_every_streamed_token_arrives_and_redis_work_is_counted() -> None:
    cells = run_sim_fleet()
    assert cells[1] == "32"  # 2 clients × 2 jobs × 8 tokens
    assert float(cells[4]) > 0 and float(cells[7]) > 0  # commands and server CPU per token


@pytest.mark.slow
def test_on_a_cluster_every_streamed_token_arrives() -> None:
    cells = run_sim_fleet("--cluster", "3", "--dialect", "openai")
    assert cells[1] == "32"
    assert float(cells[4]) > 0 and float(cells[7]) > 0
