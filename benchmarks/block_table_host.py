"""What making a step's padded block table costs the host: rebuilt from the Python lists every step
(the backends until 2026-12-07) against the persistent table updated by what changed
(conveyor/engine/block_tables.py).

    python -m benchmarks.block_table_host                       # batch 32 and 128, 2k and 8k contexts
    python -m benchmarks.block_table_host --batch 64 --blocks 256 --steps 50

Decode steps on CPU tensors (the host's share of the work is the same on a GPU host: lists walked,
a tensor built, or a few cells scattered): each step one sequence crosses a block boundary. Legs
interleaved, A (lists) then B (persistent), `--pairs` times; prints the median time per step of
each and the median B/A ratio with its range, after checking both give the same table.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from conveyor.engine.block_tables import BlockTables

BLOCK_SIZE = 16


def from_lists(tables: list[list[int]], context: list[int]) -> torch.Tensor:
    """The step's table as the backends built it before: each list cut and padded, then a tensor."""
    widths = [-(-c // BLOCK_SIZE) for c in context]
    width = max(widths)
    return torch.tensor([t[:w] + [0] * (width - w) for t, w in zip(tables, widths, strict=True)],
                        dtype=torch.int32)


def persistent(bt: BlockTables, tables: list[list[int]], context: list[int]) -> torch.Tensor:
    width = max(-(-c // BLOCK_SIZE) for c in context)
    return bt.gather(bt.rows(tables), width)


def run(batch: int, blocks: int, steps: int, pairs: int) -> None:
    rng = random.Random(0)
    tables = [rng.sample(range(1_000_000), blocks) for _ in range(batch)]
    context = [blocks * BLOCK_SIZE - rng.randrange(BLOCK_SIZE) for _ in range(batch)]
    bt = BlockTables(pad=0, device=torch.device("cpu"))
    persistent(bt, tables, context)  # the first step writes every row
    a_s, b_s, ratios = [], [], []
    for _ in range(pairs):
        start = time.perf_counter()
        for _ in range(steps):
            from_lists(tables, context)
        a = (time.perf_counter() - start) / steps
        written = bt.cells_written
        start = time.perf_counter()
        for step in range(steps):
            tables[step % batch].append(rng.randrange(1_000_000))
            context[step % batch] += BLOCK_SIZE
            persistent(bt, tables, context)
        b = (time.perf_counter() - start) / steps
        a_s.append(a)
        b_s.append(b)
        ratios.append(b / a)
    if not torch.equal(from_lists(tables, context), persistent(bt, tables, context)):
        raise SystemExit("the persistent table differs from the lists: a bug in block_tables.py")
    print(f"| {batch} | {blocks} | {statistics.median(a_s) * 1e3:.2f} | {statistics.median(b_s) * 1e3:.3f} | "
          f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | "
          f"{(bt.cells_written - written) / steps:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", default="32,128", help="sequences per step, comma-separated")
    parser.add_argument("--blocks", default="128,512",
                        help="blocks a sequence (16 tokens each), comma-separated")
    parser.add_argument("--steps", type=int, default=20, help="decode steps per leg")
    parser.add_argument("--pairs", type=int, default=5, help="A-B pairs")
    args = parser.parse_args()
    print("| batch | blocks a sequence | lists ms/step | persistent ms/step | ratio (range) "
          "| cells written/step |")
    print("|---|---|---|---|---|---|")
    for batch in (int(b) for b in args.batch.split(",")):
        for blocks in (int(b) for b in args.blocks.split(",")):
            run(batch, blocks, args.steps, args.pairs)


if __name__ == "__main__":
    main()
