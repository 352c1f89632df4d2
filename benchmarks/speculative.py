"""Speculative decoding by prompt lookup (`--speculate`): tokens/s and forwards per token with it
on and off, on a copy-heavy prompt, on free prose (drafts mostly rejected) and on random token ids,
the default model.

Legs alternate off/on in one process (`--pairs` pairs per workload); the figure is the median of
the per-pair on/off ratios, and the forward counts, which do not drift with the machine's load.
Every pair's tokens must be identical, or the script stops: greedy, or with `--temperature` sampled
with a fixed seed, whose draws speculation keeps (conveyor/engine/speculative/verify.py).

    python -m benchmarks.speculative                       # k=4, 3 pairs, 128 new tokens
    python -m benchmarks.speculative --speculate 6 --pairs 5
    python -m benchmarks.speculative --temperature 0.7     # sampled (seed 1)
    python -m benchmarks.speculative --streams 16          # 16 requests at once: throughput

With `--streams N`, each leg runs 3N requests N at a time, a new one as soon as one ends (the copy
prompts each quote the passage's sentences in another order; prose asks for different stories), and
the figure is their total output tokens per second, prefills included.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.loader import resolve_model
from conveyor.engine.params import SamplingParams, StoppingParams

PASSAGE = (
    "The queue keeps every job in a Redis stream. A worker reads a job with XREADGROUP, runs it in "
    "its engine, writes each token to the job's event stream, and acknowledges the job when its "
    "final record is written. If a worker dies, another one claims its pending jobs after the lease "
    "expires and resumes them from the events already written, so no token is generated twice."
)


SUBJECTS = ("a lighthouse keeper and a storm", "a baker who lost her recipe", "two rival chess clubs",
            "a robot learning to paint", "a city without clocks", "a dog that guards a bridge",
            "a letter delivered fifty years late", "the last train of the night")


def prompts(engine: Engine, streams: int) -> dict[str, list[list[int]]]:
    """Per workload, one prompt per stream."""
    tok = engine.tokenizer

    def chat(text: str) -> list[int]:
        messages = [{"role": "user", "content": text}]
        return list(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                               add_special_tokens=False))

    sentences = PASSAGE.split(". ")
    copies = [". ".join(sentences[i:] + sentences[:i]) for i in (s % len(sentences) for s in range(streams))]
    rng = random.Random(0)
    # Random prompt tokens (vLLM's `random` dataset) often send this model into a loop, which the
    # lookup then predicts whole: not a worst case. Free prose is: drafts are proposed (common tokens
    # recur) and mostly rejected.
    return {
        "copy": [chat(f"Repeat this text exactly, word for word:\n\n{text}") for text in copies],
        "prose": [chat(f"Write a short story about {SUBJECTS[i % len(SUBJECTS)]}.") for i in range(streams)],
        "random": [[rng.randrange(tok.vocab_size) for _ in range(128)] for _ in range(streams)],
    }


def leg(engine: Engine, prompts: list[list[int]], requests: int, new: int, k: int,
        sampling: SamplingParams) -> tuple[dict[str, list[int]], float, int]:
    """Each request's generated tokens, seconds, forwards of `requests` requests, len(prompts) at
    a time (a new one as soon as one ends, as a server's queue would), with `k` draft tokens (0: off)."""
    engine.speculator.num_tokens = k
    steps = engine.stats().steps
    tokens: dict[str, list[int]] = {}

    def add(i: int) -> None:
        tokens[f"b{i}"] = []
        stopping = StoppingParams(max_new_tokens=new, ignore_eos=True)
        engine.add(f"b{i}", prompts[i % len(prompts)], sampling, stopping)

    for i in range(min(requests, len(prompts))):
        add(i)
    started = time.perf_counter()
    while engine.has_unfinished():
        for e in engine.step():
            if e.token_id is not None:
                tokens[e.request_id].append(e.token_id)
            if e.finish_reason is not None and len(tokens) < requests:
                add(len(tokens))
    return tokens, time.perf_counter() - started, engine.stats().steps - steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--speculate", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else sampled, seed 1")
    parser.add_argument("--streams", type=int, default=1, help="requests at once per leg")
    parser.add_argument("--requests", type=int, help="per leg; default: 1 with 1 stream, else 3 per stream")
    parser.add_argument("--row-budget", type=int, help="speculator's rows per step; default: the device's")
    parser.add_argument("--workloads", default="copy,prose,random", help="of copy, prose, random")
    args = parser.parse_args()
    sampling = SamplingParams(do_sample=args.temperature > 0, temperature=args.temperature or 1.0, seed=1)
    # No prefix cache: every leg prefills its prompt, as the first request would.
    engine = Engine.from_pretrained(resolve_model(None).path, EngineConfig(enable_prefix_caching=False,
                                                                          speculate=args.speculate))
    chosen = args.workloads.split(",")
    requests = args.requests or (1 if args.streams == 1 else 3 * args.streams)
    if args.row_budget is not None:
        engine.speculator.row_budget = args.row_budget
    for name, batch in prompts(engine, args.streams).items():
        if name not in chosen:
            continue
        ratios, forwards = [], {}
        for _ in range(args.pairs):
            base = engine.speculator.stats.num_accepted_tokens, engine.speculator.stats.num_draft_tokens
            off_tokens, off_s, forwards[0] = leg(engine, batch, requests, args.new_tokens, 0, sampling)
            on_tokens, on_s, forwards[1] = leg(engine, batch, requests, args.new_tokens, args.speculate,
                                               sampling)
            if on_tokens != off_tokens:
                raise SystemExit(f"{name}: output differs with speculation on")
            ratios.append(off_s / on_s)
            generated = sum(map(len, on_tokens.values()))
            accepted = engine.speculator.stats.num_accepted_tokens - base[0]
            drafted = engine.speculator.stats.num_draft_tokens - base[1]
            print(f"{name}: off {generated / off_s:6.1f} tok/s, on {generated / on_s:6.1f} tok/s,"
                  f" x{off_s / on_s:.2f}; forwards {forwards[0]} -> {forwards[1]};"
                  f" accepted {accepted}/{drafted} draft tokens", flush=True)
        print(f"{name}: median speed-up x{statistics.median(ratios):.2f} over {args.pairs} pairs "
              f"(speculate {args.speculate}, {requests} requests {args.streams} at a time, "
              f"{args.new_tokens} new tokens each, row budget {engine.speculator.row_budget}, prompts "
              f"{min(map(len, batch))}-{max(map(len, batch))} tokens, temperature {args.temperature})")


if __name__ == "__main__":
    main()
