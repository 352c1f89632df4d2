"""The workload of benchmarks/redis_cost.py, small: three real worker processes on one Redis share the
jobs (a worker holds at most max_batch_size of them, so a burst spreads), none is lost, each job's
event indices are exactly 0..n-1, Redis saw no PUBLISH (no api follows these jobs) and at most one
event XADD per generated token (the counters the bench reports are the server's own and add up)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.redis_fleet import run_workload
from conveyor.launcher.redis_server import EmbeddedRedis

pytestmark = pytest.mark.slow

WORKERS, JOBS, TOKENS = 3, 24, 8


async def test_the_same_jobs_spread_over_three_workers_none_lost_none_twice(
        redis_server: EmbeddedRedis, tiny_model_dir: Path, tmp_path: Path) -> None:
    run = await run_workload(redis_server.url, tiny_model_dir, tmp_path, WORKERS, JOBS, TOKENS,
                             env={"CONVEYOR_MAX_BATCH_SIZE": "4"})
    assert run.lost == [] and run.bad_events == {}
    assert len(run.owners) == JOBS
    per_worker = {f"w{i}": list(run.owners.values()).count(f"w{i}") for i in range(WORKERS)}
    assert all(n > 0 for n in per_worker.values()), per_worker
    assert run.tokens == JOBS * TOKENS
    assert "publish" not in run.cost.calls  # no api follows these jobs: nothing is published live
    # each job's jobs-stream entry + its events, several tokens an entry at most one entry per token
    assert 2 * JOBS <= run.cost.calls["xadd"] <= run.tokens + JOBS
    assert 0 < run.cost.round_trips < run.cost.commands
    assert run.cost.bytes_in > 0 and run.cost.bytes_out > 0
