"""Speculative decoding by prompt lookup (`--speculate`): tokens/s and forwards per token with it
on and off, on a copy-heavy prompt and on free prose (drafts mostly rejected), one stream, the default model.

Legs alternate off/on in one process (`--pairs` pairs per workload); the figure is the median of
the per-pair on/off ratios, and the forward counts, which do not drift with the machine's load.
Every pair's tokens must be identical, or the script stops: greedy, or with `--temperature` sampled
with a fixed seed, whose draws speculation keeps (conveyor/engine/speculative/verify.py).

    python -m benchmarks.speculative                       # k=4, 3 pairs, 128 new tokens
    python -m benchmarks.speculative --speculate 6 --pairs 5
    python -m benchmarks.speculative --temperature 0.7     # sampled (seed 1)
"""

from __future__ import annotations

import argparse
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


def prompts(engine: Engine) -> dict[str, list[int]]:
    tok = engine.tokenizer
    chat = [{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{PASSAGE}"}]
    copy = tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False)
    story = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]
    prose = tok.encode(tok.apply_chat_template(story, add_generation_prompt=True, tokenize=False),
                       add_special_tokens=False)
    # Random prompt tokens send this model into a loop, which the lookup then predicts whole: not a
    # worst case. Free prose is: drafts are proposed (common tokens recur) and mostly rejected.
    return {"copy": list(copy), "prose": list(prose)}


def leg(engine: Engine, prompt: list[int], new: int, k: int,
        sampling: SamplingParams) -> tuple[list[int], float, int]:
    """Generated tokens, seconds, forwards of one request alone with `k` draft tokens (0: off)."""
    engine.speculator.num_tokens = k
    steps = engine.stats().steps
    engine.add("b", prompt, sampling, StoppingParams(max_new_tokens=new, ignore_eos=True))
    tokens: list[int] = []
    started = time.perf_counter()
    while engine.has_unfinished():
        tokens += [e.token_id for e in engine.step() if e.token_id is not None]
    return tokens, time.perf_counter() - started, engine.stats().steps - steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--speculate", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else sampled, seed 1")
    args = parser.parse_args()
    sampling = SamplingParams(do_sample=args.temperature > 0, temperature=args.temperature or 1.0, seed=1)
    # No prefix cache: every leg prefills its prompt, as the first request would.
    engine = Engine.from_pretrained(resolve_model(None).path, EngineConfig(enable_prefix_caching=False,
                                                                          speculate=args.speculate))
    for name, prompt in prompts(engine).items():
        ratios, forwards = [], {}
        for _ in range(args.pairs):
            base = engine.speculator.stats.num_accepted_tokens, engine.speculator.stats.num_draft_tokens
            off_tokens, off_s, forwards[0] = leg(engine, prompt, args.new_tokens, 0, sampling)
            on_tokens, on_s, forwards[1] = leg(engine, prompt, args.new_tokens, args.speculate, sampling)
            if on_tokens != off_tokens:
                raise SystemExit(f"{name}: output differs with speculation on")
            ratios.append(off_s / on_s)
            accepted = engine.speculator.stats.num_accepted_tokens - base[0]
            drafted = engine.speculator.stats.num_draft_tokens - base[1]
            print(f"{name}: off {len(off_tokens) / off_s:6.1f} tok/s, on {len(on_tokens) / on_s:6.1f} tok/s,"
                  f" x{off_s / on_s:.2f}; forwards {forwards[0]} -> {forwards[1]};"
                  f" accepted {accepted}/{drafted} draft tokens", flush=True)
        print(f"{name}: median speed-up x{statistics.median(ratios):.2f} over {args.pairs} pairs "
              f"(speculate {args.speculate}, {args.new_tokens} new tokens, prompt {len(prompt)} tokens, "
              f"temperature {args.temperature})")


if __name__ == "__main__":
    main()
