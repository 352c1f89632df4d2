"""benchmarks/peers.py's and benchmarks/overhead.py's pure parts: the table's ratios (A-B-A midpoint,
drift), and reading CPU seconds from /proc (no server)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from benchmarks import procstat
from benchmarks.peer_table import Row, midpoint, side_by_side, values


def summary(tps: float, ttft_ms: float, tpot_ms: float) -> dict:
    dist = {"p50": ttft_ms, "p99": 2 * ttft_ms}
    return {"completed": 4, "failed": 0, "total_token_throughput": tps, "output_throughput": tps / 3,
            "ttft_ms": dist, "tpot_ms": {"p50": tpot_ms}, "e2el_ms": {"p50": 10_000.0},
            "client_cpu_ms_per_request": 12.0}


def test_ratios_are_to_the_midpoint_of_conveyor_a_and_b() -> None:
    a, b, peer = summary(100.0, 2000.0, 50.0), summary(300.0, 4000.0, 150.0), summary(400.0, 1500.0, 50.0)
    assert values(a)[:5] == [100.0, 100.0 / 3, 2.0, 4.0, 50.0]  # TTFT in s, TPOT in ms
    base = midpoint([a, b])
    assert base is not None and base[0] == 200.0 and base[2] == 3.0 and base[4] == 100.0
    assert midpoint([]) is None
    text = side_by_side([Row("a", a), Row("b", b, values(a)), Row("peer", peer, base),
                         Row("gone", "no venv")])
    lines = text.splitlines()
    assert "(" not in lines[2]  # run a: no ratios
    assert "300.0 (3.00×)" in lines[3] and "4.00 (2.00×)" in lines[3]  # b against a: the drift
    assert "400.0 (2.00×)" in lines[4] and "1.50 (0.50×)" in lines[4] and "50.0 (0.50×)" in lines[4]
    assert "could not run: no venv" in lines[5]
    assert all(line.count("|") == lines[0].count("|") for line in lines[:5])


def test_proc_stat_parsing_survives_odd_command_names() -> None:
    tick = procstat.TICK_S
    line = "123 (a) b (c)) S 77 123 123 0 -1 0 0 0 0 0 250 50 0 0 20 0 1 0 100 0 0"
    assert procstat.parse_stat(line) == (77, pytest.approx(300 * tick))


@pytest.mark.parametrize(("argv", "role"), [
    (["/v/bin/python", "-m", "conveyor", "worker"], "worker"),
    (["/v/bin/python", "-m", "conveyor", "serve", "--port", "1"], "launcher"),
    (["/v/bin/python", "/v/bin/conveyor", "api"], "api"),
    (["/x/valkey-server", "*:0"], "valkey"),
    (["/usr/bin/sleep", "9"], "sleep"),
])
def test_roles_from_command_lines(argv: list[str], role: str) -> None:
    assert procstat.role(argv) == role


def test_own_cpu_is_counted_and_grows() -> None:
    before = procstat.snapshot(os.getpid())
    end = time.process_time() + 0.3
    while time.process_time() < end:  # burn CPU in this process
        pass
    used = procstat.delta(before, procstat.snapshot(os.getpid()))
    assert os.getpid() in procstat.descendants(os.getpid())
    assert 0.2 < used.total() < 5


def test_worker_step_seconds_from_its_metrics() -> None:
    from benchmarks.overhead import step_totals

    text = ('tgi_batch_inference_duration_sum{method="prefill"} 1.5\n'
            'tgi_batch_inference_duration_count{method="prefill"} 3.0\n'
            'tgi_batch_inference_duration_sum{method="decode"} 2.25\n'
            'tgi_batch_inference_duration_count{method="decode"} 40.0\n'
            'tgi_batch_inference_duration_bucket{le="0.1",method="decode"} 9.0\n')
    assert step_totals(text) == (3.75, 43)
    assert step_totals("") == (0.0, 0)


def test_overhead_report_ratio_and_cpu_breakdown() -> None:
    from benchmarks.overhead_report import cpu_rows, report

    engine = {"total_token_throughput": 100.0, "duration_s": 10.0, "step_s": 9.5, "steps": 50, "cpu_s": 19.0}
    full = {"total_token_throughput": 80.0, "duration_s": 12.5, "step_s": 11.0, "steps": 51,
            "cpu_s": {"worker": 20.0, "worker main thread": 1.5, "api": 2.0, "valkey": 0.5, "client": 0.25}}
    rows = dict(cpu_rows(full["cpu_s"]))
    assert rows["worker: main thread (asyncio: jobs in, tokens out to Redis)"] == 1.5
    assert rows["worker: engine thread + OpenMP pool (+ small threads)"] == 18.5
    assert rows["total"] == 22.75  # the main thread is part of the worker, not counted twice
    text = report([("engine a", engine), ("full a", {**full}), ("engine b", {**engine,
                   "total_token_throughput": 120.0})], "peer", 64)
    assert "full / engine = 0.727" in text  # 80 / mean(100, 120)
    assert "Engine drift within the sitting (last / first leg): 1.200×" in text
    assert "| api | 2.00 | 16.0 % |" in text and "+1.50 s" in text  # steps: 11.0 vs 9.5


def test_each_full_leg_is_compared_to_the_engine_legs_around_it() -> None:
    from benchmarks.overhead_report import bracketed, report

    def leg(tps: float, full: bool = False) -> dict[str, Any]:
        cpu = {"worker": 19.0, "api": 1.0} if full else 19.0
        return {"total_token_throughput": tps, "duration_s": 10.0, "step_s": 9.5, "steps": 50, "cpu_s": cpu}

    legs = [("engine a", leg(100.0)), ("full a", leg(95.0, True)), ("engine b", leg(110.0)),
            ("full b", leg(100.0, True)), ("engine c", leg(90.0)), ("full c", leg(50.0, True))]
    # the last full leg has no engine leg after it: not compared
    assert [round(x, 4) for x in bracketed(legs)] == [round(95 / 105, 4), 1.0]
    assert "each full leg to the engine legs on either side of it: 0.952** (median of 2; 0.905, 1.000)" in \
        report(legs, "peer", 64)


def test_the_sitting_s_workloads(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    import argparse
    import math

    from benchmarks.peers import workloads

    args = argparse.Namespace(model_dir=tiny_model_dir, num_prompts=6, input_len=20, output_len=5, seed=0,
                              poisson_rate=4.0, workloads="peer,mixed,poisson")
    loads = workloads(args)
    assert list(loads) == ["peer", "mixed", "poisson"]
    (peer, inf), (mixed, inf2), (poisson, rate) = loads["peer"], loads["mixed"], loads["poisson"]
    assert math.isinf(inf) and math.isinf(inf2) and rate == 4.0
    assert poisson == peer and all(r.prompt_len == 20 and r.output_len == 5 for r in peer)
    assert all(isinstance(r.prompt, list) and 32 <= len(r.prompt) <= 512 for r in mixed)
    args.workloads = "mixed"
    assert list(workloads(args)) == ["mixed"]
    args.workloads = "prefill"  # the mixed prompts, one token out each: prefill speed alone
    (prefill, inf3), = workloads(args).values()
    assert math.isinf(inf3)
    assert [r.prompt for r in prefill] == [r.prompt for r in mixed] and {r.output_len for r in prefill} == {1}


def test_dtype_sets_both_servers_alike() -> None:
    from benchmarks.peers import dtype_envs

    conveyor = {"CONVEYOR_GEMM_DTYPE": "bfloat16", "CONVEYOR_KV_CACHE_DTYPE": "bfloat16"}
    assert dtype_envs("bf16") == (conveyor, {"DTYPE": "bfloat16"})
    assert dtype_envs("fp32") == ({}, {"DTYPE": "float32"})
