"""Decode attention on KV blocks the prefix cache has given back: this tree against a base ref.

    .venv/bin/python benchmarks/recycled_cache.py [--base-ref cfaa21c] [--pairs 2]

A fresh engine's prompts get blocks in ascending order, but a server that has run a while with
prefix caching on (the default) takes its blocks from the cache's eviction order. The scenario, on
the default model with prefix caching on and a 1.25 GiB KV cache (~1,800 blocks, so that the second
workload runs on the blocks the first one freed): the mixed workload of benchmarks/engine.py (seed 1),
then a mixed workload of new prompts (seed 5, no prefix hits) timed with conveyor/engine/step_timing.py's
timers. Each leg is its own process, in the base ref's tree (a git worktree in a temporary
folder) or in this one, alternated base, new, new, base per two pairs, so that a drifting machine
cancels out. Prints per leg the timed run's seconds, its decode attention and GEMM seconds, and
how the running sequences' block tables were laid out 60 steps in (a table's next entry the block
after this one, or the block before), then new / base per pair.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYOUT_STEP = 60  # steps into the timed run when the block tables are looked at


def mixed(seed: int, vocab: int, n: int = 64) -> list[tuple[list[int], int]]:
    """benchmarks/engine.py's mixed workload: prompts of 32-512 random tokens, 16-256 new tokens."""
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(32, 512))], rng.randint(16, 256))
            for _ in range(n)]


def neighbours(tables: list[list[int]]) -> tuple[float, float]:
    """Shares of consecutive table entries that are the next block, and the previous block."""
    pairs = [(a, b) for t in tables for a, b in zip(t, t[1:], strict=False)]
    if not pairs:
        return 0.0, 0.0
    return sum(b == a + 1 for a, b in pairs) / len(pairs), sum(b == a - 1 for a, b in pairs) / len(pairs)


def leg(threads: int) -> dict[str, float]:
    """The scenario in this process, on the tree at the current directory."""
    sys.path.insert(0, os.getcwd())
    import time

    import torch

    from conveyor.engine.config import EngineConfig
    from conveyor.engine.engine import Engine
    from conveyor.engine.loader import resolve_model
    from conveyor.engine.params import StoppingParams
    from conveyor.engine.step_timing import StepTimer

    torch.set_num_threads(threads)
    engine = Engine.from_pretrained(resolve_model(None).path, EngineConfig(
        enable_prefix_caching=True, kv_cache_memory=int(1.25 * 1024**3)))
    vocab = engine.runner.vocab_size
    layout: tuple[float, float] = (0.0, 0.0)

    def run(seed: int) -> float:
        nonlocal layout
        for k, (prompt, new) in enumerate(mixed(seed, vocab)):
            engine.add(f"s{seed}-{k}", prompt, stopping=StoppingParams(max_new_tokens=new, ignore_eos=True))
        start, steps = time.perf_counter(), 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
            if steps == LAYOUT_STEP:
                layout = neighbours([s.block_table for s in engine.scheduler._running])
        return time.perf_counter() - start

    run(1)
    timer = StepTimer()
    with timer.install(engine), torch.inference_mode():
        seconds = run(5)
    pieces = [r.pieces for r in timer.records]
    return {"seconds": seconds,
            "decode_attention_s": sum(p.get("decode_attention", 0.0) for p in pieces),
            "gemm_s": sum(p.get("gemm", 0.0) + p.get("lm_head", 0.0) for p in pieces),
            "next_block": layout[0], "previous_block": layout[1],
            "blocks": engine.block_manager.num_blocks,
            "preemptions": engine.scheduler.num_preemptions}


def run_leg(tree: Path, threads: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--leg", "--threads", str(threads)],
                          cwd=tree, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"a leg in {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-ref", default="cfaa21c", help="git ref of the tree to compare with")
    parser.add_argument("--pairs", type=int, default=2, help="base/new pairs, alternated ABBA")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--leg", action="store_true", help=argparse.SUPPRESS)  # one leg, JSON out
    args = parser.parse_args()
    if args.leg:
        print(json.dumps(leg(args.threads)))
        return
    with tempfile.TemporaryDirectory(prefix="conveyor-base-") as tmp:
        base = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base),
                        args.base_ref], check=True)
        try:
            order = [("base", "new") if i % 2 == 0 else ("new", "base") for i in range(args.pairs)]
            results: list[dict[str, dict[str, float]]] = []
            for n, pair in enumerate(order, 1):
                got = {}
                for name in pair:
                    print(f"pair {n}/{args.pairs}: {name} ...", file=sys.stderr, flush=True)
                    got[name] = run_leg(base if name == "base" else REPO, args.threads)
                    r = got[name]
                    print(f"  {name:4s} run {r['seconds']:6.1f} s   decode attention "
                          f"{r['decode_attention_s']:6.2f} s   GEMMs {r['gemm_s']:6.2f} s   "
                          f"tables {LAYOUT_STEP} steps in: next block "
                          f"{100 * r['next_block']:3.0f} %, previous {100 * r['previous_block']:3.0f} %"
                          f"   ({r['blocks']:.0f} blocks, {r['preemptions']:.0f} preemptions)", flush=True)
                results.append(got)
            for n, got in enumerate(results, 1):
                new, old = got["new"], got["base"]
                print(f"pair {n}: new / base: run {new['seconds'] / old['seconds']:.3f}, "
                      f"decode attention {new['decode_attention_s'] / old['decode_attention_s']:.3f}")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)


if __name__ == "__main__":
    main()
