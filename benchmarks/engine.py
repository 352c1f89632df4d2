"""Engine throughput against Hugging Face baselines, in one process, on the default model (fp32).

    python -m benchmarks.engine                 # both workloads, all three systems
    python -m benchmarks.engine --workload peer --skip-hf
    python -m benchmarks.engine --skip-hf --max-batch-prefill-tokens 4096,2048,4096  # A-B-A
    python -m benchmarks.engine --skip-hf --admission-order arrival,shortest,shortest,arrival
    python -m benchmarks.engine --skip-hf --workload single --min-rows exact,auto,auto,exact
    python -m benchmarks.engine --skip-hf --kv-cache-dtype auto,bfloat16,bfloat16,auto
    python -m benchmarks.engine --skip-hf --gemm-dtype bfloat16   # the opt-in bf16 GEMMs

Workloads (all requests submitted at once):
  peer   64 requests, 256 random-token prompts, exactly 128 new tokens (EOS ignored): the workload
         benchmarks/peers.py runs against vLLM's CPU build.
  mixed  64 requests, prompt lengths uniform in 32–512, output lengths uniform in 16–256 (seeded).
  single one peer request alone (named only; not in "both"): one stream's time per token.
Systems: (a) HF `generate` one request at a time (on the first --one-at-a-time requests: its rate
does not depend on how many), (b) HF `generate` in padded static batches of 16 (each batch runs
until its longest output), (c) this engine. Model FLOP utilisation = model FLOPs per second
(2 × parameters used per token, per token processed; then also with attention's FLOPs added, as
PaLM's MFU counts them: benchmarks/model_flops.py) ÷ the fp32 matmul peak measured here: the
fastest of torch.mm (MKL) and oneDNN on a 2048 × 2048 matmul (the bf16 peak, oneDNN's, under
--gemm-dtype bfloat16, which measures that mode), measured
before the runs (each leg's line) and again after them (the closing table divides every leg by the
higher reading). With several
--max-batch-prefill-tokens the engine runs the workload once per budget, in that order, in one
process; each run prints TTFT p50/p99 (from submitting all requests to a request's first token)
and TPOT p50 (mean time per token after the first, per request). --admission-order the
order in which waiting requests are started (EngineConfig.admission_order); --min-rows the
row count a step's GEMMs are padded to (`exact`: the fewest the model found exact at load; `auto`,
the default: the fastest count from there, timed at load, conveyor/engine/model/row_padding.py);
--kv-cache-dtype the KV cache's element type (EngineConfig.
kv_cache_dtype; outermost: one engine per value, each loaded once, runs alternating in the order given).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from benchmarks.model_flops import attention_flops, flops_per_token
from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.loader import resolve_model
from conveyor.engine.model.linear import Linear
from conveyor.engine.params import StoppingParams


@dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int


@dataclass
class Result:
    name: str
    prompt_tokens: int
    output_tokens: int
    seconds: float

    @property
    def total_tps(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.seconds

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.seconds


def workload(name: str, vocab: int, n: int = 64) -> list[Request]:
    rng = random.Random(0)
    if name == "peer":
        return [Request([rng.randrange(vocab) for _ in range(256)], 128) for _ in range(n)]
    if name == "single":
        return [Request([rng.randrange(vocab) for _ in range(256)], 128)]
    return [
        Request([rng.randrange(vocab) for _ in range(rng.randint(32, 512))], rng.randint(16, 256))
        for _ in range(n)
    ]


def matmul_peak(seconds: float = 3.0, bf16: bool = False) -> dict[str, float]:
    """FLOP/s of a 2048 x 2048 fp32 matmul, by each GEMM library torch has here.

    torch.mm runs MKL's sgemm; oneDNN, which the engine uses on CPU, is faster on some CPUs (on
    the AMD EPYC of the development machine 212 against 176 GFLOP/s). Utilisation is reported
    against the fastest of them, so that a faster library cannot inflate it. With `bf16` (the
    engine's gemm_dtype bfloat16) the engine's own GEMM is oneDNN's in bfloat16, and so is its candidate
    (named so): utilisation is then against the bfloat16 peak.
    """
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    candidates = {"torch.mm (MKL)": lambda: a @ b}
    linear = Linear(b.t().contiguous(), bf16=bf16)  # the engine's own GEMM: x @ weight.T = a @ b
    if linear.packed:
        candidates["oneDNN bf16" if linear.bf16 else "oneDNN"] = lambda: linear(a)
    peaks = {}
    for name, matmul in candidates.items():
        matmul()
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            matmul()
            runs += 1
        peaks[name] = 2 * 2048**3 * runs / (time.perf_counter() - start)
    return peaks


def progress(label: str, done: int, total: int, start: float) -> None:
    print(f"\r  {label}: {done}/{total} ({time.perf_counter() - start:.0f} s)", end="", file=sys.stderr,
          flush=True)


def run_hf_one(model, requests: list[Request]) -> Result:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    out = 0
    for k, r in enumerate(requests):
        ids = torch.tensor([r.prompt])
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                       max_new_tokens=r.max_new_tokens, min_new_tokens=r.max_new_tokens, pad_token_id=0)
        out += r.max_new_tokens
        progress("HF one at a time", k + 1, len(requests), start)
    print(file=sys.stderr)
    return Result("(a) HF one at a time", sum(len(r.prompt) for r in requests), out,
                  time.perf_counter() - start)


def run_hf_static(model, requests: list[Request], batch: int = 16) -> Result:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for k in range(0, len(requests), batch):
        group = requests[k : k + batch]
        width = max(len(r.prompt) for r in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(group):  # left padding, as generate expects for decoder-only models
            ids[row, width - len(r.prompt) :] = torch.tensor(r.prompt)
            mask[row, width - len(r.prompt) :] = 1
        longest = max(r.max_new_tokens for r in group)
        model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=longest,
                       min_new_tokens=longest, pad_token_id=0)
        progress("HF static batches of 16", k + len(group), len(requests), start)
    print(file=sys.stderr)
    # Only the tokens each request asked for count: padding and overshoot are waste.
    return Result("(b) HF static batches of 16", sum(len(r.prompt) for r in requests),
                  sum(r.max_new_tokens for r in requests), time.perf_counter() - start)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_engine(engine: Engine, requests: list[Request]) -> tuple[Result, float, str]:
    """The engine's result, CPU share outside the forward, and a TTFT / TPOT line."""
    start = time.perf_counter()
    for k, r in enumerate(requests):
        stopping = StoppingParams(max_new_tokens=r.max_new_tokens, ignore_eos=True)
        engine.add(f"r{k}", r.prompt, stopping=stopping)
    total_out = sum(r.max_new_tokens for r in requests)
    done = 0
    first: dict[str, float] = {}
    last: dict[str, tuple[float, int]] = {}  # request → (time of its latest token, tokens so far)
    engine.reset_timings()
    while engine.has_unfinished():
        events = [e for e in engine.step() if e.token_id is not None]
        now = time.perf_counter()
        for e in events:
            first.setdefault(e.request_id, now)
            last[e.request_id] = (now, last.get(e.request_id, (now, 0))[1] + 1)
        done += len(events)
        progress("engine", done, total_out, start)
    print(file=sys.stderr)
    seconds = time.perf_counter() - start
    ttft = [t - start for t in first.values()]
    tpot = [(t - first[rid]) / (n - 1) for rid, (t, n) in last.items() if n > 1]
    latency = (f"TTFT p50 {percentile(ttft, 0.5):.2f} s  p99 {percentile(ttft, 0.99):.2f} s   "
               f"TPOT p50 {1e3 * statistics.median(tpot):.0f} ms")
    return Result("(c) conveyor engine", sum(len(r.prompt) for r in requests), done, seconds), \
        engine.overhead_share(min_batch=len(requests)), latency


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=["peer", "mixed", "both", "single"], default="both")
    parser.add_argument("--skip-hf", action="store_true", help="engine only")
    parser.add_argument("--one-at-a-time", type=int, default=8, help="requests for baseline (a)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-batch-prefill-tokens", default=str(EngineConfig().max_batch_prefill_tokens),
                        help="comma-separated budgets: one engine run per budget, in this order")
    parser.add_argument("--admission-order", default=EngineConfig().admission_order,
                        help="comma-separated 'shortest'/'arrival': one engine run per entry (per budget),"
                             " in this order")
    parser.add_argument("--min-rows", default="auto",
                        help="comma-separated 'auto' (the fastest count, timed at load), 'exact' (the fewest"
                             " exact rows, checked at load) or a number: the rows a step's GEMMs are padded"
                             " to; one engine run per entry (innermost)")
    parser.add_argument("--gemm-dtype", choices=["auto", "bfloat16"], default="auto",
                        help="the layers' GEMMs (EngineConfig.gemm_dtype)")
    parser.add_argument("--kv-cache-dtype", default="auto",
                        help="comma-separated 'auto'/'bfloat16': one engine run per entry (outermost)")
    args = parser.parse_args()
    budgets = [int(b) for b in args.max_batch_prefill_tokens.split(",")]
    torch.set_num_threads(args.threads)

    bf16 = args.gemm_dtype == "bfloat16"
    peaks = matmul_peak(bf16=bf16)
    kind = "bf16" if any("bf16" in name for name in peaks) else "fp32"
    peak = max(peaks.values())
    measured = ", ".join(f"{name} {flops / 1e9:.0f}" for name, flops in peaks.items())
    print(f"{kind} matmul peak: {peak / 1e9:.0f} GFLOP/s on {args.threads} threads ({measured})")
    source = resolve_model(None)
    kv_dtypes = args.kv_cache_dtype.split(",")
    # kv dtype -> engine, the rows chosen at load
    engines: dict[str, tuple[Engine, int]] = {}
    for kv in dict.fromkeys(kv_dtypes):
        config = EngineConfig(enable_prefix_caching=False, kv_cache_memory=4 * 1024**3, kv_cache_dtype=kv,
                              gemm_dtype=args.gemm_dtype)
        engine = Engine.from_pretrained(source.path, config)
        engines[kv] = (engine, engine.runner.model.min_rows)
    hf = None
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch.float32).eval()
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source.path)
    f_prompt, f_gen = flops_per_token(config)
    legs_flops: list[tuple[str, float, float]] = []  # each engine leg: label, model FLOP/s, with attention
    for name in (["peer", "mixed"] if args.workload == "both" else [args.workload]):
        requests = workload(name, config.vocab_size)
        print(f"\n== {name}: {len(requests)} requests, "
              f"{sum(len(r.prompt) for r in requests)} prompt + {sum(r.max_new_tokens for r in requests)} "
              "output tokens")
        attention = attention_flops(config, ((len(r.prompt), r.max_new_tokens) for r in requests))
        results = []
        if hf is not None:
            with torch.inference_mode():
                results.append(run_hf_one(hf, requests[: args.one_at_a_time]))
                results.append(run_hf_static(hf, requests))
        for r in results:
            print(f"{r.name:30s} total {r.total_tps:7.1f} tok/s   output {r.output_tps:6.1f} tok/s   "
                  f"({r.seconds:.1f} s)")
        orders = args.admission_order.split(",")
        min_rows = args.min_rows.split(",")
        legs = ((kv, o, b, m) for kv in kv_dtypes for o in orders for b in budgets for m in min_rows)
        for kv, order, budget, rows in legs:
            engine, auto_rows = engines[kv]
            engine.config.max_batch_prefill_tokens = budget  # the scheduler reads the same config
            engine.config.admission_order = order
            model = engine.runner.model  # min_rows is set per leg; exact_rows never changes
            model.min_rows = {"auto": auto_rows, "exact": model.exact_rows}.get(rows) or int(rows)
            ours, overhead, latency = run_engine(engine, requests)
            label = f"{ours.name} @{budget}"
            label += "" if len(kv_dtypes) == 1 else f" kv {kv}"
            label += "" if len(orders) == 1 else f" {order}"
            label += "" if len(min_rows) == 1 else f" rows>={model.min_rows}"
            print(f"{label:30s} total {ours.total_tps:7.1f} tok/s   "
                  f"output {ours.output_tps:6.1f} tok/s   ({ours.seconds:.1f} s)   {latency}")
            if hf is not None:
                print(f"c/a = {ours.total_tps / results[0].total_tps:.2f}   "
                      f"c/b = {ours.total_tps / results[1].total_tps:.2f}")
            flops = (ours.prompt_tokens * f_prompt + ours.output_tokens * f_gen) / ours.seconds
            with_attention = flops + attention / ours.seconds
            legs_flops.append((f"{name}: {label.strip()}", flops, with_attention))
            print(f"engine model FLOP utilisation: {100 * flops / peak:.1f} % of {peak / 1e9:.0f} GFLOP/s "
                  f"(attention's FLOPs counted too, as PaLM's MFU: {100 * with_attention / peak:.1f} %)")
            print(f"engine CPU time outside the forward, steps at batch >= {len(requests)}: "
                  f"{100 * overhead:.1f} % of the step")
    report_against_both_peaks(peak, legs_flops, bf16)


def report_against_both_peaks(start_peak: float, legs: list[tuple[str, float, float]], bf16: bool) -> None:
    """The peak measured again after the runs, and every leg's utilisation against the higher of the
    two readings: this machine's peak moves by a quarter within an hour, and a slow reading at the
    start would flatter every figure divided by it."""
    if not legs:
        return
    end_peak = max(matmul_peak(bf16=bf16).values())
    peak = max(start_peak, end_peak)
    print(f"\nmatmul peak at the start {start_peak / 1e9:.0f}, at the end {end_peak / 1e9:.0f} GFLOP/s; "
          f"utilisation against the higher, {peak / 1e9:.0f}:")
    for label, flops, with_attention in legs:
        share, share_attention = 100 * flops / peak, 100 * with_attention / peak
        print(f"  {label:48s} {share:5.1f} % (with attention's FLOPs {share_attention:5.1f} %)")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
