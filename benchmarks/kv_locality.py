"""How much the decode kernel's speed depends on where a sequence's KV blocks lie in the cache.

    .venv/bin/python benchmarks/kv_locality.py [--rows 48] [--rounds 15] [--threads 2]

The same batch (SmolLM2-135M's geometry: 9 heads, 3 KV heads, head_dim 64, 16-token blocks;
contexts uniform in 64..700, seeded) through `paged_decode.cpp`, with the block tables laid out
six ways over caches on 2 MiB pages as the engine's are:
  contiguous   each row's blocks one after another (a fresh prompt's blocks)
  descending   each row's blocks one after another, last first (what a prompt got from a free list
               that had taken a finished sequence's blocks back tail first)
  runs         each row's blocks one after another, the rows at random places with gaps between
               them (a fresh prompt's blocks in a cache that has been in use)
  runs-descending  the same, each row's blocks last first
  interleaved  round robin over the rows, block j of every row before block j + 1 of any (what
               decoding sequences that cross a block boundary in the same steps get)
  shuffled     a random permutation (a cache whose free list has been recycled for a long time)
Each call reads one of several caches in turn (8 layers' worth, larger than the last-level cache), so
it reads cold memory as the engine's 30 layers do. Prints the best and median ms per call and the
K/V read rate at the best, per layout, interleaved by round.
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

from conveyor.engine import hugepages  # noqa: E402
from conveyor.engine.attention import cpu_kernel  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
LAYOUTS = ("contiguous", "descending", "runs", "runs-descending", "interleaved", "shuffled")


def block_tables(layout: str, contexts: list[int], num_blocks: int, rng: random.Random) -> list[list[int]]:
    """Each row's block ids under `layout`; no block id is used twice."""
    counts = [-(-c // BLOCK) for c in contexts]
    if sum(counts) > num_blocks:
        raise ValueError(f"{sum(counts)} blocks needed, the cache has {num_blocks}")
    if layout == "contiguous":
        starts = [sum(counts[:r]) for r in range(len(counts))]
        return [list(range(s, s + n)) for s, n in zip(starts, counts, strict=True)]
    if layout == "descending":
        return [t[::-1] for t in block_tables("contiguous", contexts, num_blocks, rng)]
    if layout in ("runs", "runs-descending"):
        # Rows in a shuffled order, each at the start of a slot twice its length.
        order = rng.sample(range(len(counts)), len(counts))
        starts, at = [0] * len(counts), 0
        for r in order:
            starts[r], at = at, at + 2 * counts[r]
        if at > num_blocks:
            raise ValueError(f"{at} blocks needed, the cache has {num_blocks}")
        tables = [list(range(s, s + n)) for s, n in zip(starts, counts, strict=True)]
        return tables if layout == "runs" else [t[::-1] for t in tables]
    if layout == "interleaved":
        tables: list[list[int]] = [[] for _ in counts]
        next_id = 0
        for j in range(max(counts)):
            for r, n in enumerate(counts):
                if j < n:
                    tables[r].append(next_id)
                    next_id += 1
        return tables
    if layout == "shuffled":
        ids = rng.sample(range(num_blocks), sum(counts))
        return [ids[sum(counts[:r]) : sum(counts[: r + 1])] for r in range(len(counts))]
    raise ValueError(f"layout {layout!r}: use one of {', '.join(LAYOUTS)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--caches", type=int, default=8, help="caches read in turn (layers)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    module = cpu_kernel.load()
    if module is None:
        raise SystemExit(f"the decode kernel is not built: {cpu_kernel.unavailable_reason()}")
    rng = random.Random(0)
    contexts = [rng.randint(64, 700) for _ in range(args.rows)]
    num_blocks = 2 * sum(-(-c // BLOCK) for c in contexts)  # room for the runs' gaps
    caches = []
    for _ in range(args.caches):
        k, v = (torch.empty(num_blocks, KV_HEADS, BLOCK, HEAD_DIM) for _ in range(2))
        hugepages.advise(k)
        hugepages.advise(v)
        caches.append((k.normal_(), v.normal_()))
    width = max(-(-c // BLOCK) for c in contexts)
    tables = {}
    for layout in LAYOUTS:
        rows = block_tables(layout, contexts, num_blocks, rng)
        tables[layout] = torch.tensor([t + [0] * (width - len(t)) for t in rows], dtype=torch.int32)
    q = torch.randn(args.rows, HEADS, HEAD_DIM)
    context = torch.tensor(contexts, dtype=torch.int32)
    scale = HEAD_DIM**-0.5
    times: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for _ in range(args.rounds):
        for layout in LAYOUTS:
            start = time.perf_counter()
            for k, v in caches:
                module.paged_decode(q, k, v, tables[layout], context, scale, -1, 256)
            times[layout].append((time.perf_counter() - start) / len(caches))
    kv_bytes = sum(contexts) * KV_HEADS * HEAD_DIM * 4 * 2
    print(f"{args.rows} rows, {sum(contexts)} context tokens ({kv_bytes / 1e6:.1f} MB of K/V per call), "
          f"{args.threads} threads, {args.rounds} rounds")
    for layout, ts in times.items():
        print(f"  {layout:12s} best {1e3 * min(ts):6.3f} ms  median {1e3 * statistics.median(ts):6.3f} ms  "
              f"{kv_bytes / min(ts) / 1e9:5.1f} GB/s")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
