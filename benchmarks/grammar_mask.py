"""Per-token mask cost and compile time of llguidance vs xgrammar at the default model's vocabulary.

    python -m benchmarks.grammar_mask

For each library: compile a JSON schema (and a json_object grammar), then walk a fixed valid JSON
document token by token, computing the allowed-token bitmask before each token and advancing the
matcher with it. Reports compile time (cold: first grammar; the tokenizer setup separately) and the
median / p95 per-token mask time. A library that is not installed is skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "kind": {"enum": ["person", "robot"]},
    },
    "required": ["name", "age", "tags", "kind"],
    "additionalProperties": False,
}
DOCUMENT = json.dumps({"name": "Ada Lovelace", "age": 36, "tags": ["math", "engine", "notes"],
                       "kind": "person"})


def _bench_llguidance(tokenizer: Any, ids: list[int]) -> dict[str, float]:
    import llguidance
    import llguidance.hf
    import llguidance.torch
    import torch

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tokenizer)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    matcher = llguidance.LLMatcher(lltok, grammar)
    compile_s = time.perf_counter() - t0
    if matcher.is_error():
        raise RuntimeError(matcher.get_error())
    bitmask = llguidance.torch.allocate_token_bitmask(1, lltok.vocab_size)
    times = []
    for tok in ids:
        t0 = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        times.append(time.perf_counter() - t0)
        if not matcher.consume_token(tok):
            raise RuntimeError(f"llguidance rejected token {tok}: {matcher.get_error()}")
    del torch
    return {"setup_s": setup, "compile_s": compile_s, **_stats(times)}


def _bench_xgrammar(tokenizer: Any, ids: list[int]) -> dict[str, float]:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    compile_s = time.perf_counter() - t0
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    times = []
    for tok in ids:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, 0)
        times.append(time.perf_counter() - t0)
        if not matcher.accept_token(tok):
            raise RuntimeError(f"xgrammar rejected token {tok}")
    return {"setup_s": setup, "compile_s": compile_s, **_stats(times)}


def _bench_engine_path(tokenizer: Any, ids: list[int]) -> dict[str, float]:
    """What the engine pays per grammar row: llguidance's bitmask, expanded to a bool row."""
    from conveyor.engine.grammar import GrammarCompiler
    from conveyor.engine.params import Grammar

    compiler = GrammarCompiler(tokenizer, frozenset({tokenizer.eos_token_id}))
    t0 = time.perf_counter()
    compiler.tokenizer  # noqa: B018 - the one-time tokenizer view, timed apart
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    matcher = compiler.matcher(Grammar("json_schema", json.dumps(SCHEMA)), [])
    compile_s = time.perf_counter() - t0
    times = []
    for tok in ids:
        t0 = time.perf_counter()
        matcher.allowed(len(tokenizer))
        times.append(time.perf_counter() - t0)
        matcher.advance(tok)
    return {"setup_s": setup, "compile_s": compile_s, **_stats(times)}


def _stats(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"mask_median_us": statistics.median(ordered) * 1e6,
            "mask_mean_us": statistics.fmean(ordered) * 1e6,
            "mask_p95_us": ordered[int(0.95 * (len(ordered) - 1))] * 1e6,
            "mask_first_us": times[0] * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model dir (default: the packaged SmolLM2)")
    args = parser.parse_args()
    from conveyor.engine.loader import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model(args.model, progress=False).path)
    ids = tokenizer.encode(DOCUMENT, add_special_tokens=False)
    print(f"vocab {len(tokenizer)}, document {len(ids)} tokens")
    benches = (("llguidance", _bench_llguidance), ("xgrammar", _bench_xgrammar),
               ("engine row (llguidance + bool row)", _bench_engine_path))
    for name, bench in benches:
        try:
            result = bench(tokenizer, ids)
        except ImportError as e:
            print(f"{name}: not installed ({e})")
            continue
        print(name, " ".join(f"{k}={v:.4g}" for k, v in result.items()))


if __name__ == "__main__":
    main()
