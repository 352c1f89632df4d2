"""The paged decode kernel on ragged batches: a baseline kernel against this tree's, side by side.

    .venv/bin/python benchmarks/decode_attention.py [--base-ref 65eae92] [--threads 2] [--rounds 30]

Builds the kernel source of git ref --base-ref (default: the AVX2-only kernel, before the AVX-512
paths; 4f2e818 is the one before context partitions, one task per row) as a second extension
(benchmarks/kernel_ref.py), then times both in one process, interleaved A-B per round on the same inputs:
batches of 16, 32 and 64 rows with contexts uniform in 32..768 tokens (seeded), SmolLM2-135M's
geometry (9 heads, 3 KV heads, head_dim 64, block size 16), blocks shuffled over a cache larger
than the last-level cache (one layer's K/V of several batches, cycled, so each call reads cold
memory as the engine's 30 layers do). This tree's kernel also runs at a few partition sizes, and
at 256 on a copy of the caches backed by 2 MiB pages ("new 2MiB", as the engine's KV cache is), and
on a bfloat16 copy of those ("new bf16 2MiB p=256": --kv-cache-dtype bfloat16, half the bytes; its answer
is checked against the same kernel on the bf16 values widened to fp32, its GB/s still counts fp32
bytes, so it reads as the rate an fp32 cache would need for the same time).
Prints per batch the work imbalance each kernel's schedule gives (context tokens of the busiest
thread over the mean: the base splits rows into one contiguous run per thread, the new one hands
partitions longest first to the first free thread), then the best and median time of each over
the rounds, the K/V read rate at the best time (GB/s of the context's fp32 K and V, each byte
read once), base/new of the best times, and base/new per round (median, min..max): on a shared
machine the best time is the least disturbed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.kernel_ref import RefKernels  # noqa: E402
from conveyor.engine import hugepages  # noqa: E402
from conveyor.engine.attention import cpu_kernel  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16


def batches(rows: int, copies: int, rng: random.Random, k_cache: torch.Tensor) -> list[tuple]:
    """`copies` batches of the same context lengths on disjoint shuffled blocks."""
    ctxs = [rng.randint(32, 768) for _ in range(rows)]
    width = -(-max(ctxs) // BLOCK)
    free = list(range(k_cache.shape[0]))
    rng.shuffle(free)
    out = []
    for _ in range(copies):
        tables = [[free.pop() for _ in range(-(-c // BLOCK))] for c in ctxs]
        padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        q = torch.randn(rows, HEADS, HEAD_DIM)
        out.append((q, padded, torch.tensor(ctxs, dtype=torch.int32)))
    return out


def imbalance(ctxs: list[int], threads: int, partition: int | None) -> float:
    """Busiest thread's tokens / mean, under the base's static split (partition None) or the new
    kernel's longest-first list scheduling of partitions (cost = tokens)."""
    if partition is None:
        chunk = -(-len(ctxs) // threads)
        loads = [sum(ctxs[t * chunk : (t + 1) * chunk]) for t in range(threads)]
    else:
        tasks = sorted((min(partition, c - lo) for c in ctxs for lo in range(0, c, partition)), reverse=True)
        loads = [0] * threads
        for cost in tasks:
            loads[loads.index(min(loads))] += cost
    return max(loads) / (sum(ctxs) / threads)


def timed(call: Callable[[tuple], torch.Tensor], inputs: list[tuple], calls: int) -> float:
    call(inputs[0])
    t0 = time.perf_counter()
    for i in range(calls):
        call(inputs[i % len(inputs)])
    return (time.perf_counter() - t0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-ref", default="65eae92", help="git ref of the baseline kernel source")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=5, help="calls per timing")
    parser.add_argument("--partitions", default="128,256,512", help="partition sizes of the new kernel")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    new = cpu_kernel.load()
    if new is None:
        sys.exit(f"kernel not built: {cpu_kernel.unavailable_reason()}")
    base = RefKernels(args.base_ref).module
    rng = random.Random(0)
    copies = 4
    num_blocks = 64 * (768 // BLOCK + 1) * copies
    k_cache = torch.randn(num_blocks, KV_HEADS, BLOCK, HEAD_DIM)
    v_cache = torch.randn(num_blocks, KV_HEADS, BLOCK, HEAD_DIM)
    scale = HEAD_DIM**-0.5
    partitions = [int(p) for p in args.partitions.split(",")]
    kernels: dict[str, Callable[[tuple], torch.Tensor]] = {
        "base": lambda b: base.paged_decode(b[0], k_cache, v_cache, b[1], b[2], scale, -1),
    }
    for p in partitions:
        kernels[f"new p={p}"] = lambda b, p=p: new.paged_decode(
            b[0], k_cache, v_cache, b[1], b[2], scale, -1, p
        )
    # The engine's cache sits on 2 MiB pages (conveyor/engine/hugepages.py); the caches above on 4 KiB ones.
    k_huge, v_huge = torch.empty_like(k_cache), torch.empty_like(v_cache)
    if hugepages.advise(k_huge) and hugepages.advise(v_huge):
        k_huge.copy_(k_cache)
        v_huge.copy_(v_cache)
        kernels["new 2MiB p=256"] = lambda b: new.paged_decode(
            b[0], k_huge, v_huge, b[1], b[2], scale, -1, 256
        )
    k_bf16 = torch.empty(k_cache.shape, dtype=torch.bfloat16)
    v_bf16 = torch.empty_like(k_bf16)
    for cache in (k_bf16, v_bf16):  # 2 MiB pages where the kernel allows, as the engine's cache
        hugepages.advise(cache)
    k_bf16.copy_(k_cache)
    v_bf16.copy_(v_cache)
    kernels["new bf16 2MiB p=256"] = lambda b: new.paged_decode(
        b[0], k_bf16, v_bf16, b[1], b[2], scale, -1, 256
    )
    k_wide, v_wide = k_bf16.float(), v_bf16.float()  # what the bf16 cache holds, in fp32
    print(f"threads {args.threads}, {args.rounds} rounds x {args.calls} calls, base = {args.base_ref}")
    # What this machine streams at all: a plain torch sum over both caches (larger than the LLC).
    stream = min(timed(lambda _: k_cache.sum() + v_cache.sum(), [()], 2) for _ in range(5))
    print(f"read rate of a plain torch sum over the caches: {2 * k_cache.nbytes / stream / 1e9:.1f} GB/s")
    for rows in (16, 32, 64):
        inputs = batches(rows, copies, rng, k_cache)
        ref = base.paged_decode(inputs[0][0], k_cache, v_cache, inputs[0][1], inputs[0][2], scale, -1)
        wide = new.paged_decode(inputs[0][0], k_wide, v_wide, inputs[0][1], inputs[0][2], scale, -1, 256)
        for name, call in kernels.items():  # same answer before timing it
            expected = wide if "bf16" in name else ref
            torch.testing.assert_close(call(inputs[0]), expected, rtol=1e-4, atol=1e-5)
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for _ in range(args.rounds):
            for name, call in kernels.items():
                times[name].append(timed(call, inputs, args.calls))
        ctxs = [int(c) for c in inputs[0][2]]
        tokens = sum(ctxs)
        kv_bytes = tokens * KV_HEADS * HEAD_DIM * 4 * 2
        balance = ", ".join(
            f"{name} {imbalance(ctxs, args.threads, None if name == 'base' else int(name.split('=')[1])):.3f}"
            for name in kernels
        )
        print(f"\n{rows} rows: busiest thread / mean at {args.threads} threads: {balance}")
        print(
            f"\n{rows} rows, {tokens} context tokens ({kv_bytes / 1e6:.1f} MB of K/V): best / median ms,"
            " GB/s at the best, base/new of the best, base/new per round median (min..max)"
        )
        for name, ts in times.items():
            ratios = [b / t for b, t in zip(times["base"], ts, strict=True)]
            print(
                f"  {name:10s} {1e3 * min(ts):7.3f} / {1e3 * statistics.median(ts):7.3f} ms "
                f"{kv_bytes / min(ts) / 1e9:6.1f} GB/s   "
                f"{min(times['base']) / min(ts):.3f}   "
                f"{statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})"
            )


if __name__ == "__main__":
    with torch.inference_mode():
        main()
