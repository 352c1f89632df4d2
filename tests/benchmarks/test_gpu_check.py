"""benchmarks/gpu_check.sh on this CPU machine: the correctness part (a) runs under Triton's
interpreter and passes, the GPU parts are marked skipped with a reason; --smoke-speed runs the
speed parts' code on a tiny model and its byte and FLOP counts match the model's shape. And the
pass rule of the comparison against Hugging Face (benchmarks/gpu_correctness.py), without a model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("triton")
from benchmarks import gpu_check  # noqa: E402
from benchmarks.gpu_correctness import Greedy, compare_to_reference, judged_like_hf  # noqa: E402
from benchmarks.gpu_speed import SMOKE_SHAPE  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY_SPEED = ["--smoke-speed", "--decode-batches", "1,2", "--context", "40", "--prefill", "2x32",
              "--decode-steps", "2", "--rounds", "1"]  # fmt: skip


def _run(out: Path, *args: str, returncode: int = 0) -> dict[str, Any]:
    # No GPU even where one is: the CPU path is what this test is about.
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(["bash", str(REPO / "benchmarks/gpu_check.sh"), "--tiny", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == returncode, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| check | result | target |" in proc.stdout  # the table is printed
    assert (out / "gpu_check.md").read_text().startswith("GPU check:")
    assert "correctness: start" in (out / "gpu_check.log").read_text()
    return json.loads((out / "gpu_check.json").read_text())


def test_cpu_run_checks_correctness_and_skips_the_gpu_parts(tmp_path: Path) -> None:
    r = _run(tmp_path)
    c = r["correctness"]
    assert c["device"] == "cpu" and c["dtype"] == "torch.float32" and c["passed"] is True
    assert set(c["backends"]) == {"triton", "torch"}
    for name, b in c["backends"].items():
        assert b["attention"] == name and b["passed"] is True
        vs = b["vs_hf"]
        assert vs["prompts"] == c["shape"]["prompts"] and vs["new_tokens"] == c["shape"]["new_tokens"]
        assert vs["prompts_token_identical"] == vs["prompts"] and vs["divergences"] == []
        assert 0 < vs["max_abs_logit_diff"] < vs["logit_tolerance"] == 1e-3  # computed, not zero
        alone = b["alone_vs_together"]
        assert alone["passed"] is True and alone["equal"] is True  # fp32: both, exactly
        assert alone["tokens_equal"] == alone["vs_hf_tokens_equal"] == alone["tokens_total"] == 3 * 4
        assert "no CUDA" in b["graphs_on_vs_off"]["skipped"]
    for part in ("ceilings", "model_8b", "decode", "prefill", "cuda_tests"):
        assert "no CUDA" in r[part]["skipped"] and r["skipped"][part] == r[part]["skipped"]
    assert r["versions"]["torch"] and r["versions"]["triton"] and r["versions"]["device"].startswith("CPU")
    assert "skipped: no CUDA device" in (tmp_path / "gpu_check.md").read_text()


def _expected_params(s: dict[str, Any]) -> tuple[int, int]:
    """(all parameters, linear-layer weights) of a Llama of this shape, counted from the shape."""
    h, inter, v, layers = s["hidden_size"], s["intermediate_size"], s["vocab_size"], s["num_hidden_layers"]
    hd = h // s["num_attention_heads"]
    qkv = h * (s["num_attention_heads"] + 2 * s["num_key_value_heads"]) * hd
    linear = layers * (qkv + h * h + 3 * h * inter)
    return linear + 2 * v * h + layers * 2 * h + h, linear


def test_smoke_speed_counts_bytes_and_flops_of_the_model(tmp_path: Path) -> None:
    r = _run(tmp_path, *TINY_SPEED)
    info, s = r["model_8b"], SMOKE_SHAPE
    params, linear = _expected_params(s)
    assert (info["params"], info["linear_params"]) == (params, linear)
    assert info["weight_bytes"] == 4 * params  # fp32 on CPU
    hd = s["hidden_size"] // s["num_attention_heads"]
    assert info["kv_bytes_per_token"] == 2 * s["num_hidden_layers"] * s["num_key_value_heads"] * hd * 4
    bw = r["ceilings"]["bandwidth_bytes_per_s"]
    assert [row["batch"] for row in r["decode"]] == [1, 2]
    for row in r["decode"]:
        assert row["context"] == 41
        assert row["bytes_per_step"] == info["weight_bytes"] + info["kv_bytes_per_token"] * 41 * row["batch"]
        assert row["roofline_step_s"] == pytest.approx(row["bytes_per_step"] / bw)
        # No graphs on CPU (as after a failed capture on a GPU): the eager figures still come.
        assert "no CUDA" in row["graphs"]["skipped"]
        m = row["eager"]
        assert m["step_s"] > 0 and m["tokens_per_s"] == pytest.approx(row["batch"] / m["step_s"])
        assert m["roofline_share"] == pytest.approx(row["roofline_step_s"] / m["step_s"])
        assert m["host_syncs_per_step"] is None and "CUDA only" in m["host_syncs_why"]
    p = r["prefill"]
    keys = 2 * 32 * 33 // 2  # two prompts of 32 rows, row i sees i + 1 keys
    flops = 2 * linear * 64 + 2 * s["vocab_size"] * s["hidden_size"] * 2
    flops += 4 * s["num_hidden_layers"] * s["num_attention_heads"] * hd * keys
    assert p["flops"] == flops and p["tokens_per_s"] == pytest.approx(64 / p["step_s"])
    md = (tmp_path / "gpu_check.md").read_text()
    assert r["smoke_speed"] is True and "mean nothing" in md
    assert "graphs skipped: no CUDA device" in md and "| (b) decode batch 2, context 41 |" in md
    # The kernel table of one eager step at the largest batch (32 when measured): CPU operators here.
    k = r["kernels"]
    assert (k["batch"], k["context"], k["clock"], k["launches_per_step"]) == (2, 41, "cpu", None)
    shares = [e["share"] for e in k["kernels"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    assert any("mm" in e["name"] or "linear" in e["name"] for e in k["kernels"])  # the GEMMs show
    assert "| (b) kernels, decode batch 2, eager |" in md


def test_a_part_past_its_budget_fails_alone(tmp_path: Path) -> None:
    """The correctness part cut at its 1 s budget: an error saying so, and the parts after it run."""
    r = _run(tmp_path, *TINY_SPEED, "--budget", "correctness=1", returncode=1)
    assert r["correctness"]["timed_out"] is True and "1 s budget" in r["correctness"]["error"]
    for part in ("ceilings", "model_8b"):  # the budget ends with its part
        assert "error" not in r[part], r[part]
    assert [row["batch"] for row in r["decode"]] == [1, 2] and r["prefill"]["step_s"] > 0
    assert "(a) correctness | error: PartTimeout" in (tmp_path / "gpu_check.md").read_text()


def test_a_cut_decode_part_keeps_its_rows_in_the_json(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = []

    def decode() -> None:
        rows.append(_ROW)
        time.sleep(5)

    results: dict[str, Any] = {"skipped": {}}
    outer = signal.getsignal(signal.SIGALRM)  # pytest-timeout's, where it runs
    out = gpu_check.run_part(results, "decode", decode, tmp_path, budget_s=0.2, partial=rows)
    assert out["timed_out"] is True and out["rows"] == [_ROW]
    on_disk = json.loads((tmp_path / "gpu_check.json").read_text())
    assert on_disk["decode"]["rows"] == [_ROW]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| (b) decode batch 8, context 1001 | graphs error: RuntimeError: replay" in md
    assert "eager 800 tok/s = 50% of roofline (10.00 ms/step, 2 host syncs/step)" in md
    assert "| (b) decode | error: PartTimeout" in md
    assert signal.getsignal(signal.SIGALRM) is outer  # the part's timer ends with it


_ROW = {
    "batch": 8, "context": 1001, "bytes_per_step": 1, "roofline_step_s": 0.005, "roofline_tokens_per_s": 1600,
    "graphs": {"error": "RuntimeError: replay"},
    "eager": {"step_s": 0.01, "tokens_per_s": 800, "roofline_share": 0.5, "host_syncs_per_step": 2.0},
}  # fmt: skip


def test_runs_in_other_batches_are_judged_like_hf_and_equality_only_reported() -> None:
    """bf16: prompts alone part from the batched run at a near-tie of HF's: passes, not equal."""
    ref = [_greedy([[1.0, 0.0, 0.0], [0.0, 2.0, 1.99]])]
    alone = [_greedy([[1.0, 0.0, 0.0], [0.0, 1.99, 2.0]])]
    seen = judged_like_hf(ref, ref, alone, tolerance=0.02, truth=None)
    assert seen["passed"] is True and seen["equal"] is False and seen["prompts_differing"] == [0]
    assert (seen["tokens_equal"], seen["vs_hf_tokens_equal"], seen["tokens_total"]) == (1, 1, 2)
    far = [_greedy([[1.0, 0.0, 0.0], [0.0, 1.0, 2.5]])]  # parts where HF had a clear winner
    assert judged_like_hf(ref, ref, far, tolerance=0.02, truth=None)["passed"] is False


def _greedy(rows: list[list[float]]) -> Greedy:
    logits = [torch.tensor(r) for r in rows]
    return Greedy(tokens=[int(x.argmax()) for x in logits], logits=logits)


def test_a_parting_passes_only_at_a_near_tie() -> None:
    ref = [_greedy([[1.0, 0.0, 0.0], [0.0, 2.0, 1.99]])]
    tie = [_greedy([[1.0, 0.0, 0.0], [0.0, 1.99, 2.0]])]  # parts at step 1, where ref's margin is 0.01
    seen = compare_to_reference(ref, tie, tolerance=0.02)
    assert seen["passed"] and seen["prompts_token_identical"] == 0 and seen["tokens_equal"] == 1
    assert seen["divergences"] == [{"prompt": 0, "step": 1, "hf_top2_margin": pytest.approx(0.01)}]
    assert seen["max_abs_logit_diff"] == pytest.approx(0.01)
    assert not compare_to_reference(ref, tie, tolerance=0.001)["passed"]  # logits off by 10x tol
    far = [_greedy([[1.0, 0.0, 0.0], [0.0, 1.0, 2.5]])]
    assert not compare_to_reference(ref, far, tolerance=0.1)["passed"]
    # Close to the fp32 truth, yet parting from the reference where it had a clear winner: fails.
    clear = [_greedy([[1.0, 0.0, 0.0], [0.0, 2.0, 1.0]])]
    flipped = [_greedy([[1.0, 0.0, 0.0], [0.0, 1.0, 2.0]])]
    truth_of_flipped = [torch.stack(flipped[0].logits)]
    assert not compare_to_reference(clear, flipped, tolerance=0.1, truth=truth_of_flipped)["passed"]
    truth = [torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 1.99]])]
    assert compare_to_reference(ref, ref, tolerance=1e-6, truth=truth)["passed"]
    assert not compare_to_reference(ref, ref, tolerance=1e-6, truth=[truth[0] + 0.1])["passed"]
