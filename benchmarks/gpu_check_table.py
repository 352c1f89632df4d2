"""benchmarks/gpu_check.py's one-screen table (gpu_check.md) from its results (gpu_check.json)."""

from __future__ import annotations

from typing import Any

DECODE_TARGET, PREFILL_TARGET = 0.70, 0.60  # issue 43: at batch 32 and 128; of the bf16 peak
_PARTS = (
    ("ceilings", "ceilings"),
    ("model_8b", "(b, c) 8B model"),
    ("decode", "(b) decode"),
    ("kernels", "(b) kernels"),
    ("prefill", "(c) prefill"),
    ("cuda_tests", "test_attention_cuda.py"),
)


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _same(check: dict[str, Any]) -> str:
    """Two runs of the engine: judged as against HF (the pass), exact equality only reported."""
    if "skipped" in check:
        return f"skipped: {check['skipped']}"
    exact = "exactly equal" if check["equal"] else f"differ for prompts {check['prompts_differing']}"
    return (
        ("pass" if check["passed"] else "FAIL")
        + f" vs HF ({check['vs_hf_tokens_equal']}/{check['tokens_total']} tokens, max abs logit diff "
        f"{check['vs_hf_max_abs_logit_diff']:.3g}); to each other {exact}, {check['tokens_equal']}/"
        f"{check['tokens_total']} tokens (max abs logit diff {check['max_abs_logit_diff']:.3g})"
    )


def _vs_hf(h: dict[str, Any]) -> str:
    fp32 = h.get("max_abs_logit_diff_vs_fp32")
    vs32 = "" if fp32 is None else f", vs fp32 {fp32:.3g}"
    return (
        f"{h['prompts_token_identical']}/{h['prompts']} prompts token-identical "
        f"({h['tokens_equal']}/{h['tokens_total']} tokens), max abs logit diff "
        f"{h['max_abs_logit_diff']:.3g}{vs32} (tol {h['logit_tolerance']:.3g}): "
        + ("pass" if h["passed"] else "FAIL")
    )


def correctness_rows(c: dict[str, Any]) -> list[str]:
    if "error" in c:
        return [f"| (a) correctness | error: {c['error'][:160]} | pass |"]
    rows = []
    for name, b in c.get("backends", {}).items():
        label = f"(a) {name} vs HF, {c['dtype'].removeprefix('torch.')} on {c['device']}"
        if "error" in b:
            rows.append(f"| {label} | error: {b['error'][:160]} | pass |")
            continue
        rows.append(f"| {label} | {_vs_hf(b['vs_hf'])} | tokens equal, or logits within tol |")
        judged = "as vs HF; equality reported"
        rows.append(f"| (a) {name}: alone vs together | {_same(b['alone_vs_together'])} | {judged} |")
        rows.append(f"| (a) {name}: CUDA graphs on vs off | {_same(b['graphs_on_vs_off'])} | {judged} |")
    return rows


def _mode(mode: str, m: dict[str, Any]) -> str:
    if "step_s" not in m:
        why = "skipped" if "skipped" in m else "error"
        return f"{mode} {why}: {m[why][:120]}"
    syncs = m.get("host_syncs_per_step")
    sync = "" if syncs is None else f", {syncs:g} host syncs/step"
    return (
        f"{mode} {m['tokens_per_s']:,.0f} tok/s = {_pct(m['roofline_share'])} of roofline "
        f"({m['step_s'] * 1e3:.2f} ms/step{sync})"
    )


def decode_row(row: dict[str, Any]) -> str:
    target = "0 host syncs"
    if row["batch"] in (32, 128):
        target = f"≥ {_pct(DECODE_TARGET)} (graphs); {target}"
    modes = "; ".join(_mode(mode, row[mode]) for mode in ("graphs", "eager"))
    return (
        f"| (b) decode batch {row['batch']}, context {row['context']} | {modes}; roofline "
        f"{row['roofline_tokens_per_s']:,.0f} tok/s | {target} |"
    )


def kernel_rows(k: dict[str, Any]) -> list[str]:
    """The profiled step's totals, then its heaviest kernels (operators on CPU), one row each."""
    if "kernels" not in k:
        return []
    launches = "" if k["launches_per_step"] is None else f", {k['launches_per_step']:.0f} launches"
    rows = [f"| (b) kernels, decode batch {k['batch']}, eager | {k['us_per_step'] / 1e3:.2f} ms of "
            f"{k['clock']} time per step{launches} | where the step's time goes |"]
    rows += [f"| (b) kernel `{e['name'][:60]}` | {e['us_per_step']:.0f} µs ({_pct(e['share'])}), "
             f"{e['calls_per_step']:g} calls per step | |" for e in k["kernels"][:12]]
    return rows


def table(r: dict[str, Any]) -> str:
    v = r.get("versions", {})
    lines = [
        f"GPU check: {v.get('device')}; torch {v.get('torch')} (CUDA {v.get('torch_cuda')}), "
        f"triton {v.get('triton')}, transformers {v.get('transformers')}",
        "",
        "| check | result | target |",
        "|---|---|---|",
        *correctness_rows(r.get("correctness", {})),
    ]
    ceil = r.get("ceilings", {})
    if "bandwidth_bytes_per_s" in ceil:
        lines.append(
            f"| ceilings | copy {ceil['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s (read + write), "
            f"bf16 matmul {ceil['bf16_matmul_flops_per_s'] / 1e12:.0f} TFLOP/s | measured |"
        )
    decode = r.get("decode")
    if isinstance(decode, dict):  # cut short or failed: the rows it measured before that
        decode = decode.get("rows", [])
    if isinstance(decode, list):
        lines += [decode_row(row) for row in decode]
    lines += kernel_rows(r.get("kernels", {}))
    p = r.get("prefill", {})
    if "tokens_per_s" in p:
        lines.append(
            f"| (c) prefill {p['prompts']} x {p['prompt_len']} | {p['tokens_per_s']:,.0f} tok/s, "
            f"{p['flops_per_s'] / 1e12:.0f} TFLOP/s = {_pct(p['peak_share'])} of the bf16 peak "
            f"| ≥ {_pct(PREFILL_TARGET)} |"
        )
    for key, label in _PARTS:
        part = r.get(key)
        if isinstance(part, dict) and "skipped" in part:
            lines.append(f"| {label} | skipped: {part['skipped']} | |")
        elif isinstance(part, dict) and "error" in part:
            lines.append(f"| {label} | error: {part['error'][:160]} | |")
    t = r.get("cuda_tests", {})
    if "passed" in t:
        lines.append(f"| test_attention_cuda.py | {'pass' if t['passed'] else 'FAIL'} | pass |")
    if r.get("smoke_speed"):
        lines.append("\n(b) and (c) ran as a smoke run on CPU (a tiny model): their figures mean nothing.")
    lines.append(f"\nwall time {r.get('wall_s', 0):.0f} s")
    return "\n".join(lines) + "\n"
