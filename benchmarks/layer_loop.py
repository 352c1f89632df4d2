"""A pure-decode step's time with the forward's layer loop in C++ against the Python loop, step by
step alternating in one process (so the machine's drift falls on both alike).

    .venv/bin/python benchmarks/layer_loop.py                       # 8, 32 and 64 rows, 20 steps each way
    .venv/bin/python benchmarks/layer_loop.py --rows 16,64 --steps 40

For each row count: an engine on the default model (fp32, prefix caching off) takes that many
requests of --prompt random tokens, runs their prefill, then steps them in pure decode, switching
Llama.layer_stack (conveyor/engine/model/layer_loop.cpp) on and off every step. Prints the median step time
of each loop and their ratio; the bits are the same either way (tests/engine/test_layer_loop.py).
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

from conveyor.engine.config import EngineConfig  # noqa: E402
from conveyor.engine.engine import Engine  # noqa: E402
from conveyor.engine.loader import resolve_model  # noqa: E402
from conveyor.engine.params import StoppingParams  # noqa: E402


def measure(engine: Engine, rows: int, steps: int, prompt: int, seed: int) -> dict[str, list[float]]:
    """Seconds of each pure-decode step, by loop, over `steps` steps each."""
    model = engine.runner.model
    stack = model.layer_stack
    rng = random.Random(seed)
    vocab = model.vocab_size
    for i in range(rows):
        ids = [rng.randrange(vocab) for _ in range(prompt)]
        engine.add(f"{rows}-{i}", ids, stopping=StoppingParams(max_new_tokens=2 * steps + 4, ignore_eos=True))
    while engine.scheduler.prefill_backlog or engine.scheduler.num_waiting:
        engine.step()  # the prefill, and the decode rows that ride with its last chunks
    times: dict[str, list[float]] = {"cpp": [], "python": []}
    try:
        for i in range(2 * steps):
            loop = "cpp" if i % 2 == 0 else "python"
            model.layer_stack = stack if loop == "cpp" else None
            start = time.perf_counter()
            engine.step()
            times[loop].append(time.perf_counter() - start)
    finally:
        model.layer_stack = stack
    while engine.has_unfinished():
        engine.step()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="8,32,64", help="comma-separated decode batch sizes")
    parser.add_argument("--steps", type=int, default=20, help="pure-decode steps per loop per row count")
    parser.add_argument("--prompt", type=int, default=300, help="prompt tokens per request")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = EngineConfig(enable_prefix_caching=False, kv_cache_memory=4 * 1024**3)
    engine = Engine.from_pretrained(resolve_model(None).path, config)
    if engine.runner.model.layer_stack is None:
        sys.exit("the C++ layer loop is not built or not usable here (conveyor/engine/model/layer_stack.py says when)")
    print("| decode rows | Python loop, ms/step (median) | C++ loop | C++ ÷ Python |")
    print("|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        print(f"{rows} rows: prefill, then {2 * args.steps} decode steps ...", file=sys.stderr)
        times = measure(engine, rows, args.steps, args.prompt, seed=rows)
        py, cpp = (1e3 * statistics.median(times[k]) for k in ("python", "cpp"))
        print(f"| {rows} | {py:.1f} | {cpp:.1f} | {cpp / py:.3f} |", flush=True)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
