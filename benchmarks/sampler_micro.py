"""The sampler per step, fused greedy kernel against the torch path, side by side in one process.

    .venv/bin/python benchmarks/sampler_micro.py [--threads 2] [--repeat 40]

Sampler.sample on random float32 logits over SmolLM2's 49,152-token vocabulary, batches of 1-64
greedy rows (and one of 64 rows, a quarter of them sampled with top-p), run A-B interleaved on the
same inputs: A with the kernel turned off (log_softmax + argmax, the sampler before issue 19), B
with conveyor/engine/greedy.cpp. Prints the median ms of each, the median of the per-pair ratios A/B and
its 10-90 % spread, which is what to compare on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.engine import greedy_kernel  # noqa: E402
from conveyor.engine.params import SamplingParams  # noqa: E402
from conveyor.engine.sampler import Sampler  # noqa: E402
from conveyor.engine.sequence import Sequence  # noqa: E402

VOCAB = 49152


def batch(rows: int, sampled: int = 0) -> list[Sequence]:
    def one(i: int) -> Sequence:
        params = SamplingParams(do_sample=True, top_p=0.9, seed=i) if i < sampled else SamplingParams()
        return Sequence(request_id=f"r{i}", prompt_ids=[1], sampling=params)

    return [one(i) for i in range(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if greedy_kernel.load() is None:
        sys.exit("the greedy kernel could not be built: nothing to compare")
    kernel_usable = greedy_kernel.usable
    sampler = Sampler()
    print("| rows (sampled) | torch path, ms | fused kernel, ms | ratio (10-90 %) |\n|---|---|---|---|")
    for rows, sampled in ((1, 0), (8, 0), (16, 0), (32, 0), (64, 0), (64, 16)):
        logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(rows)) * 3
        seqs = batch(rows, sampled)
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeat + 2):  # the first pair warms up
            for fused in (False, True):
                greedy_kernel.usable = kernel_usable if fused else (lambda x: False)
                start = time.perf_counter()
                sampler.sample(logits, seqs)
                times[fused].append(time.perf_counter() - start)
        greedy_kernel.usable = kernel_usable
        a, b = times[False][2:], times[True][2:]
        ratios = sorted(x / y for x, y in zip(a, b, strict=True))
        lo, hi = ratios[len(ratios) // 10], ratios[(9 * len(ratios)) // 10]
        print(f"| {rows} ({sampled}) | {1e3 * statistics.median(a):.3f} | {1e3 * statistics.median(b):.3f} | "
              f"{statistics.median(ratios):.2f}x ({lo:.2f}-{hi:.2f}) |")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
