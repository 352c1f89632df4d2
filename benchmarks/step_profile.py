"""Where the engine's step time goes, by kind of step, on benchmarks/engine.py's workloads (one process).

    python -m benchmarks.step_profile                  # peer and mixed, 2 threads
    python -m benchmarks.step_profile --workload mixed --json /tmp/mixed.json
    python -m benchmarks.step_profile --kv-cache-dtype bfloat16   # the opt-in bf16 KV cache
    python -m benchmarks.step_profile --gemm-dtype bfloat16   # the opt-in bf16 GEMMs

Runs the engine in-process on the default model (fp32, prefix caching off, as benchmarks/engine.py
does) observed by benchmarks/step_timer.py (Engine.observe), and classifies each step by its batch:
prefill-heavy (prefill tokens are at least half the step's tokens), mixed (some prefill beside more
decode rows), pure decode. For each kind it prints the share of step time of each piece, as a
markdown table, and the model FLOP utilisation (benchmarks/engine.py's FLOPs over the fp32 matmul peak
measured at the start of the same run; measured again at the end, the run's utilisation is also
printed against the higher reading), also as it would be were every piece but the GEMMs free (the
GEMMs' own speed at these steps' row counts: the ceiling of the workload's shapes); pure decode
steps again by batch rows, with each piece's ms per step. Writes everything
as JSON too. The timer costs ~1 µs a piece (measured and printed), under 1 % of a step.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.engine import matmul_peak, run_engine, workload
from benchmarks.model_flops import flops_per_token
from benchmarks.step_timer import StepRecord, StepTimer
from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.loader import resolve_model
from conveyor.engine.native import greedy as greedy_kernel

RESULTS = Path(__file__).resolve().parent / "results"

KINDS = ("prefill-heavy", "mixed", "pure decode")
# Table rows: a label and the timer's pieces it sums (benchmarks/step_timer.py names them).
CATEGORIES = {
    "GEMMs (linear layers + lm_head)": ("gemm", "lm_head"),
    "prefill attention": ("prefill_attention",),
    "decode attention": ("decode_attention",),
    "KV writes (+ attention call)": ("attention",),
    "norms, RoPE, activations, embedding": ("norm", "forward"),
    "sampler": ("sampler",),
    "scheduler + Python/bookkeeping": ("step", "schedule", "execute"),
}
ROW_BUCKETS = ((64, 10**9), (32, 63), (16, 31), (1, 15))


def kind(r: StepRecord) -> str:
    if not r.prefill_tokens:
        return "pure decode"
    return "prefill-heavy" if r.prefill_tokens >= r.decode_rows else "mixed"


def summarize(records: list[StepRecord], f_prompt: float, f_gen: float, peak: float) -> dict:
    """Shares, step counts and utilisation of a set of steps."""
    seconds = sum(r.seconds for r in records)
    pieces: defaultdict[str, float] = defaultdict(float)
    for r in records:
        for name, s in r.pieces.items():
            pieces[name] += s
    flops = sum((r.decode_rows + r.prefill_tokens) * f_prompt + r.sampled_rows * (f_gen - f_prompt)
                for r in records)
    gemm_s = pieces["gemm"] + pieces["lm_head"]
    out = {
        "steps": len(records),
        "seconds": seconds,
        "ms_per_step": 1e3 * seconds / len(records) if records else 0.0,
        "tokens_per_step": sum(r.decode_rows + r.prefill_tokens for r in records) / max(1, len(records)),
        "flop_utilisation": flops / seconds / peak if seconds else 0.0,
        # the ceiling of these steps' shapes: every piece but the GEMMs free, the GEMMs as measured
        "gemm_only_utilisation": flops / gemm_s / peak if gemm_s else 0.0,
        "pieces_s": dict(pieces),
        "shares": {label: sum(pieces[n] for n in names) / seconds if seconds else 0.0
                   for label, names in CATEGORIES.items()},
    }
    if "sampler_torch_path" in pieces:  # the same steps with the torch sampler path instead
        before = seconds - pieces["sampler"] + pieces["sampler_torch_path"]
        out["sampler_before_share"] = pieces["sampler_torch_path"] / before if before else 0.0
        out["sampler_ms_per_step"] = [1e3 * pieces[k] / len(records)
                                      for k in ("sampler_torch_path", "sampler")]
    return out


def table(by_kind: dict[str, dict], overall: dict) -> str:
    cols = [*KINDS, "all steps"]
    stats = [*(by_kind[k] for k in KINDS), overall]
    lines = ["| share of step time | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for label in CATEGORIES:
        lines.append(f"| {label} | " + " | ".join(f"{100 * s['shares'][label]:.1f} %" for s in stats) + " |")
    if "sampler_before_share" in overall:
        lines.append("| sampler before: torch path, same steps | " + " | ".join(
            f"{100 * s.get('sampler_before_share', 0):.1f} %" for s in stats) + " |")
        lines.append("| sampler ms per step, before → after | " + " | ".join(
            "{:.2f} → {:.2f}".format(*s.get("sampler_ms_per_step", (0, 0))) for s in stats) + " |")
    lines.append("| steps | " + " | ".join(str(s["steps"]) for s in stats) + " |")
    lines.append("| share of run time | " + " | ".join(
        f"{100 * s['seconds'] / overall['seconds']:.0f} %" for s in stats) + " |")
    lines.append("| ms per step (mean) | " + " | ".join(f"{s['ms_per_step']:.0f}" for s in stats) + " |")
    lines.append("| tokens per step (mean) | "
                 + " | ".join(f"{s['tokens_per_step']:.0f}" for s in stats) + " |")
    lines.append("| model FLOP utilisation | " + " | ".join(
        f"{100 * s['flop_utilisation']:.1f} %" for s in stats) + " |")
    lines.append("| same, were every piece but the GEMMs free | " + " | ".join(
        f"{100 * s['gemm_only_utilisation']:.1f} %" for s in stats) + " |")
    return "\n".join(lines)


def bucket_table(buckets: dict[str, dict]) -> str:
    """Pure-decode steps by batch rows: ms per step of each piece (the per-op costs that do not
    shrink with the batch show here, where the shares hide them)."""
    cols = [rows for rows, s in buckets.items() if s["steps"]]
    lines = ["| ms per pure-decode step | " + " | ".join(f"{rows} rows" for rows in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for label, names in CATEGORIES.items():
        lines.append(f"| {label} | " + " | ".join(
            f"{1e3 * sum(buckets[c]['pieces_s'].get(n, 0.0) for n in names) / buckets[c]['steps']:.2f}"
            for c in cols) + " |")
    lines.append("| step | " + " | ".join(f"{buckets[c]['ms_per_step']:.2f}" for c in cols) + " |")
    return "\n".join(lines)


def shadow_sampler(engine: Engine) -> list[float]:
    """Before each real sampler call, the same call with the fused greedy kernel turned off (the
    sampler before issue 19: log_softmax + argmax), on the same logits and rows; the result is
    dropped (the tokens are the same, tests/engine/test_greedy_kernel.py). Returns the list its
    seconds are appended to, one per call; take them out of the step with `unshadow`."""
    times: list[float] = []
    real, usable = engine.sampler.sample, greedy_kernel.usable

    def sample(logits: torch.Tensor, seqs: list) -> object:
        greedy_kernel.usable = lambda x: False
        start = time.perf_counter()
        try:
            real(logits, seqs)
        finally:
            greedy_kernel.usable = usable
        times.append(time.perf_counter() - start)
        return real(logits, seqs)

    engine.sampler.sample = sample  # type: ignore[method-assign]
    return times


def unshadow(records: list[StepRecord], times: list[float]) -> None:
    """Moves each step's shadow sampler time out of its sampler piece and its seconds, into
    pieces["sampler_torch_path"] (which no category sums). No times (--no-sampler-ab): nothing to move."""
    if not times:
        return
    pending = iter(times)
    for r in records:
        if r.sampled_rows:  # the engine calls the sampler once in each step that samples
            t = next(pending)
            r.pieces["sampler"] -= t
            r.seconds -= t
            r.pieces["sampler_torch_path"] = t


def timer_cost(n: int = 20000) -> float:
    """Seconds one observed piece adds: its start and stop around nothing."""
    timer = StepTimer()
    start = time.perf_counter()
    for _ in range(n):
        timer.start("noop")
        timer.stop("noop")
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["peer", "mixed", "both"], default="both")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64, help="fewer for a quick check")
    parser.add_argument("--json", type=Path, default=RESULTS / "step_profile.json",
                        help="where to write the results [default: %(default)s]")
    parser.add_argument("--no-sampler-ab", dest="sampler_ab", action="store_false",
                        help="do not also time the torch sampler path on each step's logits")
    parser.add_argument("--kv-cache-dtype", choices=["auto", "bfloat16"], default="auto",
                        help="the KV cache's element type (EngineConfig.kv_cache_dtype)")
    parser.add_argument("--gemm-dtype", choices=["auto", "bfloat16"], default="auto",
                        help="the layers' GEMMs (EngineConfig.gemm_dtype)")
    args = parser.parse_args()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)

    bf16 = args.gemm_dtype == "bfloat16"
    peaks = matmul_peak(bf16=bf16)
    peak = max(peaks.values())
    kind_of_peak = "bf16" if any("bf16" in name for name in peaks) else "fp32"  # oneDNN's bf16 GEMM
    print(f"{kind_of_peak} matmul peak: {peak / 1e9:.0f} GFLOP/s on {args.threads} threads ("
          + ", ".join(f"{name} {f / 1e9:.0f}" for name, f in peaks.items()) + ")")
    source = resolve_model(None)
    engine = Engine.from_pretrained(source.path, EngineConfig(
        enable_prefix_caching=False, kv_cache_memory=4 * 1024**3, kv_cache_dtype=args.kv_cache_dtype,
        gemm_dtype=args.gemm_dtype))
    from transformers import AutoConfig

    loop = "C++" if engine.runner.model.layer_stack is not None else "Python"
    print(f"layer loop: {loop}")
    f_prompt, f_gen = flops_per_token(AutoConfig.from_pretrained(source.path))
    cost = timer_cost()
    out: dict = {"peak_flops": peak, "peaks": peaks, "threads": args.threads, "timer_cost_s": cost,
                 "layer_loop": loop, "workloads": {}}
    for name in (["peer", "mixed"] if args.workload == "both" else [args.workload]):
        requests = workload(name, engine.runner.vocab_size, args.requests)
        timer = StepTimer()
        shadow = shadow_sampler(engine) if args.sampler_ab else []
        with timer.attached(engine):
            result, _, _ = run_engine(engine, requests)
        if args.sampler_ab:
            del engine.sampler.sample  # the shadow
        records = timer.records
        unshadow(records, shadow)
        by_kind = {k: summarize([r for r in records if kind(r) == k], f_prompt, f_gen, peak) for k in KINDS}
        overall = summarize(records, f_prompt, f_gen, peak)
        decode = [r for r in records if kind(r) == "pure decode"]
        buckets = {
            f"{lo}-{hi}" if hi < 10**9 else f">={lo}":
                summarize([r for r in decode if lo <= r.decode_rows <= hi], f_prompt, f_gen, peak)
            for lo, hi in ROW_BUCKETS
        }
        print(f"\n== {name}: {len(requests)} requests, {result.prompt_tokens} prompt + "
              f"{result.output_tokens} output tokens, {result.seconds:.1f} s, "
              f"{result.total_tps:.0f} total tok/s (profiled)")
        print(table(by_kind, overall))
        print("pure decode by batch rows: " + ", ".join(
            f"{rows}: {s['steps']} steps, {s['ms_per_step']:.0f} ms, "
            f"{100 * s['flop_utilisation']:.0f} % FLOP util."
            for rows, s in buckets.items() if s["steps"]))
        print(bucket_table(buckets))
        per_step = timer.calls / max(1, len(records))
        print(f"timer: {per_step:.0f} pieces a step x {cost * 1e6:.2f} µs = "
              f"{100 * per_step * cost / (overall['seconds'] / max(1, len(records))):.2f} % of a step")
        out["workloads"][name] = {
            "requests": len(requests), "prompt_tokens": result.prompt_tokens,
            "output_tokens": result.output_tokens, "seconds": result.seconds,
            "kinds": by_kind, "all": overall, "pure_decode_by_rows": buckets,
            "calls_per_step": per_step,
        }
        args.json.write_text(json.dumps(out, indent=1))  # after each workload: a long run keeps what it did
        print(f"wrote {args.json}")
    # Measured again after the runs (as benchmarks/engine.py does): this machine's peak moves by a quarter
    # within an hour, and a slow reading at the start flatters every utilisation above.
    end_peak = max(matmul_peak(bf16=bf16).values())
    higher = max(peak, end_peak)
    out["peak_flops_end"] = end_peak
    args.json.write_text(json.dumps(out, indent=1))
    print(f"\nmatmul peak at the start {peak / 1e9:.0f}, at the end {end_peak / 1e9:.0f} GFLOP/s; the tables "
          f"divide by the start's. Against the higher, {higher / 1e9:.0f}: " + ", ".join(
              f"{name} {100 * w['all']['flop_utilisation'] * peak / higher:.1f} %"
              for name, w in out["workloads"].items()))


if __name__ == "__main__":
    with torch.inference_mode():
        main()
