"""bench/step_profile.py's summary of timed steps (no model, no engine)."""

from __future__ import annotations

import pytest

from bench.step_profile import kind, summarize
from engine.step_timing import StepRecord


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
