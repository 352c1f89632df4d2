"""benchmarks/step_profile.py's summary of timed steps (no model, no engine)."""

from __future__ import annotations

import pytest

from benchmarks.step_profile import bucket_table, kind, summarize
from benchmarks.step_timer import StepRecord


def test_summary_utilisation_and_its_gemm_only_ceiling() -> None:
    records = [
        StepRecord(decode_rows=0, prefill_tokens=100, sampled_rows=2, seconds=2.0,
                   pieces={"gemm": 1.5, "prefill_attention": 0.5}),
        StepRecord(decode_rows=4, prefill_tokens=0, sampled_rows=4, seconds=1.0,
                   pieces={"gemm": 0.3, "lm_head": 0.2, "decode_attention": 0.5}),
    ]
    f_prompt, f_gen, peak = 10.0, 15.0, 100.0
    out = summarize(records, f_prompt, f_gen, peak)
    flops = 104 * f_prompt + 6 * (f_gen - f_prompt)
    assert out["flop_utilisation"] == pytest.approx(flops / 3.0 / peak)
    assert out["gemm_only_utilisation"] == pytest.approx(flops / 2.0 / peak)  # 1.5 + 0.3 + 0.2 s of GEMMs
    assert out["shares"]["GEMMs (linear layers + lm_head)"] == pytest.approx(2.0 / 3.0)
    assert [kind(r) for r in records] == ["prefill-heavy", "pure decode"]


def test_summary_of_no_steps_is_zero_not_a_division_error() -> None:
    out = summarize([], 1.0, 2.0, 3.0)
    assert out["steps"] == 0 and out["flop_utilisation"] == 0.0 and out["gemm_only_utilisation"] == 0.0


def test_bucket_table_gives_each_piece_in_ms_per_step_and_skips_empty_buckets() -> None:
    steps = [StepRecord(decode_rows=8, prefill_tokens=0, sampled_rows=8, seconds=0.04,
                        pieces={"gemm": 0.03, "norm": 0.001, "forward": 0.002, "decode_attention": 0.007})
             for _ in range(2)]
    buckets = {"16-31": summarize([], 1.0, 1.0, 1.0), "1-15": summarize(steps, 1.0, 1.0, 1.0)}
    lines = bucket_table(buckets).splitlines()
    assert lines[0] == "| ms per pure-decode step | 1-15 rows |"
    rows = dict(line.strip("|").split("|")[:2] for line in lines[2:])
    assert rows[" norms, RoPE, activations, embedding "].strip() == "3.00"  # (1 + 2) ms a step
    assert rows[" decode attention "].strip() == "7.00"
    assert rows[" step "].strip() == "40.00"
