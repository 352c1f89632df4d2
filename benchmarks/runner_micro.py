"""Micro benchmark of ModelRunner.execute on SmolLM2-135M's shapes with random weights.

    .venv/bin/python benchmarks/runner_micro.py [--threads 2] [--repeat 5] [--profile]

Times one decode step (64 rows, 320 tokens of context each, blocks shuffled in the cache) and one
prefill (16 prompts x 256 tokens) and prints GFLOP/s as 2 x parameters x tokens / time, the figure
the engine benchmark uses, and its fraction of the ~212 GFLOP/s fp32 matmul peak measured here.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.engine.config import EngineConfig  # noqa: E402
from conveyor.engine.model_runner import ModelRunner  # noqa: E402
from conveyor.engine.sequence import Sequence  # noqa: E402
from conveyor.engine.step_plan import ScheduledChunk  # noqa: E402

# The fastest fp32 2048 x 2048 matmul on the development machine (oneDNN; MKL's is ~176).
# benchmarks/engine.py measures it on the machine it runs on.
PEAK_GFLOPS = 212.0
SMOLLM2_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


def random_sequences(
    runner: ModelRunner, count: int, length: int, rng: random.Random, free: list[int]
) -> list[Sequence]:
    seqs = []
    for i in range(count):
        seq = Sequence(f"s{i}", [rng.randrange(runner.vocab_size) for _ in range(length)])
        seq.block_table = [free.pop() for _ in range(-(-length // runner.block_size))]
        seqs.append(seq)
    return seqs


def _time(runner: ModelRunner, chunks: list[ScheduledChunk], repeat: int) -> float:
    runner.execute(chunks)  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        runner.execute(chunks)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="print the top ops of one decode step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).eval()
    params = sum(p.numel() for p in hf.parameters())  # tied embedding counted once
    runner = ModelRunner(hf, EngineConfig(num_blocks=4096, device="cpu"))
    del hf
    rng = random.Random(0)
    free = list(range(runner.num_blocks))
    rng.shuffle(free)  # no sequence gets contiguous blocks: the worst case for the gather

    decode = [ScheduledChunk(s, 319, 1) for s in random_sequences(runner, 64, 320, rng, free)]
    prefill = [ScheduledChunk(s, 0, 256) for s in random_sequences(runner, 16, 256, rng, free)]
    print(f"SmolLM2-135M shapes, {params / 1e6:.1f}M parameters, {args.threads} threads")
    kernel = " + C++ paged decode kernel" if getattr(runner.attention, "kernel", False) else ""
    print(f"KV cache {runner.kv_cache_summary()}, attention {runner.attention.name}{kernel}")
    head = runner.vocab_size * SMOLLM2_135M["hidden_size"]
    for name, chunks in (("decode 64 x 1 (ctx 320)", decode), ("prefill 16 x 256", prefill)):
        tokens = sum(c.length for c in chunks)
        dt = _time(runner, chunks, args.repeat)
        gflops = 2 * params * tokens / dt / 1e9
        # What the GEMMs really did: the lm_head runs only for the rows that sample.
        executed = 2 * ((params - head) * tokens + head * sum(c.sample for c in chunks)) / dt / 1e9
        print(
            f"{name:24s} {dt * 1e3:8.1f} ms  {gflops:6.1f} GFLOP/s (2 x params x tokens, "
            f"{gflops / PEAK_GFLOPS:4.0%} of peak)  {executed:6.1f} GFLOP/s executed"
        )
    if args.profile:
        with torch.profiler.profile() as prof:
            runner.execute(decode)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
