"""What a pure-decode step costs by its number of rows: N sequences decoding together, the median
step time, N in turns (interleaved rounds, so the machine's drift falls on all N alike).

Speculative decoding's row budget rests on it (conveyor/engine/speculative/policy.py): a draft
token is a row, nearly free while a forward is bound by reading the weights, about its share of
the GEMMs beyond.

    python -m benchmarks.decode_rows                    # 1,4,8,16,32,64,80 rows, 3 rounds
    python -m benchmarks.decode_rows --rows 1,16,80 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.loader import resolve_model
from conveyor.engine.params import SamplingParams, StoppingParams

STEPS = 12  # decodes per sequence; the first 3 steps (the prefill, warm-up) are not counted


def step_time(engine: Engine, rows: int, tag: str) -> float:
    """Median seconds of the pure-decode steps of `rows` sequences of 64-token prompts."""
    for i in range(rows):
        engine.add(f"{tag}-{i}", list(range(100 + i, 164 + i)), SamplingParams(),
                   StoppingParams(max_new_tokens=STEPS, ignore_eos=True))
    times = []
    while engine.has_unfinished():
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    return statistics.median(times[3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,4,8,16,32,64,80")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    counts = [int(n) for n in args.rows.split(",")]
    engine = Engine.from_pretrained(resolve_model(None).path, EngineConfig(enable_prefix_caching=False))
    seconds: dict[int, list[float]] = {n: [] for n in counts}
    for r in range(args.rounds):
        for n in counts:
            seconds[n].append(step_time(engine, n, f"{r}-{n}"))
    for n in counts:
        ms = statistics.median(seconds[n]) * 1000
        print(f"{n:4d} rows: {ms:7.1f} ms a step, {ms / n:6.2f} ms a row", flush=True)


if __name__ == "__main__":
    main()
