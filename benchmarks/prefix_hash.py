"""The prefix cache's block hash (conveyor/jobqueue/prefix_hash.py, BLAKE2b) against Python's tuple hash it
replaced, on the chain of a 4096-token prompt (256 blocks of 16), interleaved A/B in one process:

    .venv/bin/python benchmarks/prefix_hash.py
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.jobqueue.prefix_hash import block_hash  # noqa: E402


def tuple_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


def main() -> None:
    rng = random.Random(0)
    blocks = [tuple(rng.randrange(50_000) for _ in range(16)) for _ in range(256)]

    def chain(fn) -> float:  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        for _ in range(200):
            parent = None
            for block in blocks:
                parent = fn(parent, block)
        return (time.perf_counter() - started) / 200

    ratios = []
    for rep in range(7):
        order = [("tuple", tuple_hash), ("blake2b", block_hash)]
        times = dict((name, chain(fn)) for name, fn in (order if rep % 2 == 0 else order[::-1]))
        ratios.append(times["blake2b"] / times["tuple"])
        print(f"rep {rep}: 4096-token chain: tuple {times['tuple'] * 1e6:.0f} us, blake2b "
              f"{times['blake2b'] * 1e6:.0f} us ({times['blake2b'] / len(blocks) * 1e6:.2f} us/block)")
    low, high = min(ratios), max(ratios)
    print(f"blake2b/tuple: median {statistics.median(ratios):.1f}x, range {low:.1f}-{high:.1f}")


if __name__ == "__main__":
    main()
