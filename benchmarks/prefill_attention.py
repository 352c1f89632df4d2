"""Prefill attention on CPU, old path (SDPA chunk by chunk over gathered K/V) against the C++ paged
prefill kernel, side by side in one process.

    .venv/bin/python benchmarks/prefill_attention.py                # micro: one layer's attention
    .venv/bin/python benchmarks/prefill_attention.py --engine 2     # + benchmarks/engine.py's mixed workload, A-B x 2
    .venv/bin/python benchmarks/prefill_attention.py --base-ref 65eae92   # old = that ref's kernel, not SDPA

Micro: SmolLM2-135M geometry (9 heads, 3 KV heads, head_dim 64, the engine's block size), blocks
shuffled in the cache, for single fresh chunks of 32..512 rows, a chunk continuing a prompt
(start > 0), and a mixed step of ragged chunks (prompt lengths 32..512, seeded, up to the engine's
prefill token budget). Both paths get the same inputs; old and new alternate within each repeat,
and the figures are medians over repeats of each side's fastest call in 0.2 s. GFLOP/s counts
4 x head_dim x heads per visible (query, key) pair; the ratio's spread is the min..max of the
per-repeat ratios. --base-ref REF makes "old" the paged_prefill kernel of git ref REF (built beside
this tree's by benchmarks/kernel_ref.py; 65eae92 is the AVX2-only one) instead of SDPA.

--engine N: the mixed workload of benchmarks/engine.py on the real model through one Engine, N times
each path, alternating old, new, old, new (the same as running benchmarks/engine.py --workload mixed
--skip-hf with CONVEYOR_CPU_ATTENTION=decode, then unset, but in one sitting and one process).
With --base-ref, old is that ref's decode and prefill kernels, new this tree's (the engine's calls
to cpu_kernel.paged_decode / paged_prefill are pointed at one build or the other per run);
--workload peer|mixed|both picks benchmarks/engine.py's workloads.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.engine.attention import AttentionBatch, AttentionGeometry, cpu_kernel  # noqa: E402
from conveyor.engine.attention.torch_paged import TorchAttention  # noqa: E402
from conveyor.engine.config import EngineConfig  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def _cases(budget: int) -> dict[str, list[tuple[int, int]]]:
    """name -> chunks as (start, length)."""
    cases = {f"fresh {n}": [(0, n)] for n in (32, 64, 128, 256, 512)}
    cases["continue 256+256"] = [(256, 256)]
    rng = random.Random(0)
    mixed: list[tuple[int, int]] = []
    while sum(n for _, n in mixed) < budget:
        mixed.append((0, min(rng.randint(32, 512), budget - sum(n for _, n in mixed))))
    cases[f"mixed {len(mixed)} chunks"] = mixed
    cases["mixed 8 x 32..512"] = [(0, random.Random(1).randint(32, 512)) for _ in range(8)]
    return cases


def _batch(chunks: list[tuple[int, int]], bs: int, blocks: list[int]) -> AttentionBatch:
    """A prefill-only step: every chunk's context laid out on shuffled blocks."""
    tables, slots, used = [], [], 0
    for start, n in chunks:
        width = -(-(start + n) // bs)
        tables.append(blocks[used : used + width])
        used += width
        slots += [tables[-1][p // bs] * bs + p % bs for p in range(start, start + n)]
    return AttentionBatch(0, [n for _, n in chunks], [s + n for s, n in chunks], tables, torch.tensor(slots))


def _flops(chunks: list[tuple[int, int]]) -> float:
    pairs = sum((start + 1 + start + n) * n / 2 for start, n in chunks)  # row p sees p + 1 keys
    return 4.0 * HEAD_DIM * HEADS * pairs


def _time(fn, min_seconds: float = 0.2) -> float:  # type: ignore[no-untyped-def]
    """The fastest of the calls made in min_seconds (at least three): on a shared machine the
    fastest call is the one least disturbed by other processes."""
    fn()
    best, runs, start = float("inf"), 0, time.perf_counter()
    while runs < 3 or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return best


def micro(repeats: int, base_ref: str | None = None) -> None:
    bs, budget = EngineConfig().block_size, EngineConfig().max_batch_prefill_tokens
    num_blocks = 2 * budget // bs + 64
    geometry = AttentionGeometry(
        HEADS, KV_HEADS, HEAD_DIM, bs, num_blocks, torch.device("cpu"), torch.float32
    )
    new = TorchAttention(geometry)
    if not new.prefill_kernel:
        sys.exit(f"the prefill kernel is not available: {cpu_kernel.unavailable_reason()}")
    old = TorchAttention(geometry)
    old.prefill_kernel = False  # what CONVEYOR_CPU_ATTENTION=decode selects
    base = None
    if base_ref is not None:
        from benchmarks.kernel_ref import RefKernels

        base = RefKernels(base_ref)
        if not base.has_prefill:
            sys.exit(f"{base_ref} has no paged_prefill.cpp")
        print(f"old = the paged_prefill kernel of {base_ref}, new = this tree's ({cpu_kernel.load().simd()})")
    k_cache, v_cache = torch.randn(new.cache_shape()), torch.randn(new.cache_shape())
    blocks = list(range(num_blocks))
    random.Random(0).shuffle(blocks)
    print(f"block_size {bs}, {torch.get_num_threads()} threads, {repeats} repeats (medians)")
    print(
        f"{'case':24s} {'rows':>5s} {'old GFLOP/s':>12s} {'new GFLOP/s':>12s} {'new/old':>8s} {'spread':>12s}"
    )
    for name, chunks in _cases(budget).items():
        batch = _batch(chunks, bs, blocks)
        old_meta, p = old.prepare(batch), new.prepare(batch).paged_prefill
        rows = sum(batch.query_lens)
        qk = torch.randn(rows, HEADS + KV_HEADS, HEAD_DIM)  # as the model hands them: views of one tensor
        q, k, v = qk[:, :HEADS], qk[:, HEADS:], torch.randn(rows, KV_HEADS, HEAD_DIM)
        out = q.new_empty(q.shape)

        def run_old() -> None:  # noqa: B023 - run in this iteration only
            if base is not None:
                base.paged_prefill(q, k_cache, v_cache, p.tables, p.starts, p.lens, geometry.scale, None, out)  # noqa: B023
                return
            for i, chunk in enumerate(old_meta.prefills):  # noqa: B023
                old._prefill(q, k, v, k_cache, v_cache, chunk, old._mask(old_meta, 1, i, None), out)  # noqa: B023

        def run_new() -> None:
            args = (p.tables, p.starts, p.lens, geometry.scale, None)  # noqa: B023
            cpu_kernel.paged_prefill(q, k_cache, v_cache, *args, out=out)  # noqa: B023

        times: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(repeats):
            times["old"].append(_time(run_old))
            times["new"].append(_time(run_new))
        ratios = [o / n for o, n in zip(times["old"], times["new"], strict=True)]
        flops = _flops(chunks)
        t_old, t_new = statistics.median(times["old"]), statistics.median(times["new"])
        print(
            f"{name:24s} {rows:5d} {flops / t_old / 1e9:12.1f} {flops / t_new / 1e9:12.1f} "
            f"{statistics.median(ratios):7.2f}x {min(ratios):5.2f}..{max(ratios):.2f}"
        )


def engine_ab(
    repeats: int, n_requests: int, base_ref: str | None = None, workloads: tuple[str, ...] = ("mixed",)
) -> None:
    """benchmarks/engine.py's workloads through one Engine, old and new in turn: the prefill kernel
    off and on, or (base_ref) that ref's kernels and this tree's."""
    from transformers import AutoConfig

    from benchmarks.engine import matmul_peak, run_engine, workload
    from benchmarks.model_flops import flops_per_token
    from conveyor.engine.engine import Engine
    from conveyor.engine.loader import resolve_model

    peak = max(matmul_peak().values())
    source = resolve_model(None)
    engine = Engine.from_pretrained(
        source.path, EngineConfig(enable_prefix_caching=False, kv_cache_memory=4 * 1024**3)
    )
    attention = engine.runner.attention
    if not getattr(attention, "prefill_kernel", False):
        sys.exit(f"the prefill kernel is not in use: {cpu_kernel.unavailable_reason()}")
    config = AutoConfig.from_pretrained(source.path)
    f_prompt, f_gen = flops_per_token(config)
    ours = (cpu_kernel.paged_decode, cpu_kernel.paged_prefill)
    base = None
    if base_ref is not None:
        from benchmarks.kernel_ref import RefKernels

        base = RefKernels(base_ref)
    labels = {False: "old (SDPA prefill)", True: "new (prefill kernel)"}
    if base is not None:
        labels = {False: f"old ({base_ref} kernels)", True: f"new ({cpu_kernel.load().simd()} kernels)"}

    def select(new: bool) -> None:
        if base is None:
            attention.prefill_kernel = new
            return
        cpu_kernel.paged_decode, cpu_kernel.paged_prefill = (
            ours if new else (base.paged_decode, base.paged_prefill)
        )

    for name in workloads:
        requests = workload(name, config.vocab_size, n_requests)
        print(
            f"\n== engine, {name} workload ({n_requests} requests), fp32 matmul peak {peak / 1e9:.0f} GFLOP/s"
        )
        tps: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeats):
            for new in (False, True):
                select(new)
                result, _, _ = run_engine(engine, requests)
                tps[new].append(result.total_tps)
                mfu = (result.prompt_tokens * f_prompt + result.output_tokens * f_gen) / result.seconds / peak
                print(
                    f"{labels[new]:24s} total {result.total_tps:7.1f} tok/s  MFU {100 * mfu:5.1f} %"
                    f"  ({result.seconds:.1f} s)"
                )
        select(True)
        ratios = [n / o for o, n in zip(tps[False], tps[True], strict=True)]
        spread = f"{min(ratios):.3f}..{max(ratios):.3f}"
        print(f"new/old total tok/s: median {statistics.median(ratios):.3f} ({spread})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="A-B pairs per micro case")
    parser.add_argument("--base-ref", help="git ref whose prefill kernel is 'old' (default: SDPA)")
    parser.add_argument("--engine", type=int, default=0, metavar="N", help="also N A-B pairs of the engine")
    parser.add_argument("--requests", type=int, default=64, help="engine: requests (benchmarks/engine.py: 64)")
    parser.add_argument(
        "--workload", choices=("mixed", "peer", "both"), default="mixed", help="engine: workload"
    )
    parser.add_argument("--skip-micro", action="store_true", help="engine A-B only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not args.skip_micro:
        micro(args.repeats, args.base_ref)
    if args.engine:
        workloads = ("peer", "mixed") if args.workload == "both" else (args.workload,)
        engine_ab(args.engine, args.requests, args.base_ref, workloads)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
