"""The engine's greedy output equals Hugging Face `generate` for each request alone, on the default
model in fp32 — whatever the batch around it: mixed lengths, late arrivals, chunked prefill,
prefix-cache hits, preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.events import TokenEvent
from conveyor.engine.params import SamplingParams, StoppingParams

pytestmark = pytest.mark.slow

NEW_TOKENS = 24
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why each is prime. Be brief but precise, please.",
    "Hi",
    "Translate to French: The cat sleeps on the warm windowsill while the rain falls outside.",
    "Explain what a KV cache is in a transformer language model, in two sentences.",
]
SYSTEM = (
    "You are a helpful assistant for a company that builds job queues. You answer questions about "
    "Redis Streams, consumer groups, acknowledgements and retries with short, correct answers. "
)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path):  # type: ignore[no-untyped-def]
    from conveyor.engine.loader import load_tokenizer

    return load_tokenizer(default_model_dir)


@pytest.fixture(scope="module")
def hf_model(default_model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    # The engine runs with ignore_eos: the reference must not stop (or be steered away) at EOS.
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="module")
def reference(hf_model, tokenizer):  # type: ignore[no-untyped-def]
    """Greedy HF output per prompt, computed once (cached by prompt ids)."""
    cache: dict[tuple[int, ...], list[int]] = {}

    def run(ids: list[int], n: int = NEW_TOKENS) -> list[int]:
        key = (*ids, -n)
        if key not in cache:
            with torch.inference_mode():
                x = torch.tensor([ids])
                out = hf_model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                        max_new_tokens=n, pad_token_id=0)
            cache[key] = out[0, len(ids):].tolist()
        return cache[key]

    return run


def make_engine(model_dir: Path, **overrides) -> Engine:  # type: ignore[no-untyped-def]
    config = EngineConfig(**{"kv_cache_memory": 64 * 1024**2, **overrides})
    return Engine.from_pretrained(model_dir, config)


def run_all(engine: Engine, arrivals: dict[int, list[tuple[str, list[int]]]] | None = None,
            max_steps: int = 10_000) -> dict[str, list[int]]:
    """Steps until idle; `arrivals[k]` are added before step k. Returns generated ids by request."""
    arrivals = arrivals or {}
    tokens: dict[str, list[int]] = {}
    step = 0
    while step < max_steps and (engine.has_unfinished() or any(k >= step for k in arrivals)):
        for rid, ids in arrivals.get(step, []):
            engine.add(rid, ids, stopping=StoppingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
        events: list[TokenEvent] = engine.step()
        for e in events:
            if e.token_id is not None:
                tokens.setdefault(e.request_id, []).append(e.token_id)
        step += 1
    return tokens


def encode(tokenizer, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return tokenizer(text)["input_ids"]


def check_all_blocks_free(engine: Engine) -> None:
    stats = engine.stats()
    assert stats.running == 0 and stats.waiting == 0
    assert stats.blocks_used == 0


def test_mixed_batch_of_different_lengths(default_model_dir, tokenizer, reference) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(default_model_dir)
    prompts = {f"r{i}": encode(tokenizer, p) for i, p in enumerate(PROMPTS)}
    got = run_all(engine, {0: list(prompts.items())})
    for rid, ids in prompts.items():
        assert got[rid] == reference(ids), rid
    check_all_blocks_free(engine)


def test_requests_arriving_while_others_decode(default_model_dir, tokenizer, reference) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(default_model_dir)
    ids = [encode(tokenizer, p) for p in PROMPTS]
    arrivals = {0: [("a", ids[0]), ("b", ids[1])], 5: [("c", ids[2])], 9: [("d", ids[3]), ("e", ids[4])],
                17: [("f", ids[5])]}
    got = run_all(engine, arrivals)
    for k, rid in enumerate("abcdef"):
        assert got[rid] == reference(ids[k]), rid


def test_chunked_prefill_with_a_small_budget(default_model_dir, tokenizer, reference) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(default_model_dir, max_batch_prefill_tokens=7)
    prompts = {f"r{i}": encode(tokenizer, p) for i, p in enumerate(PROMPTS)}
    got = run_all(engine, {0: list(prompts.items())[:3], 3: list(prompts.items())[3:]})
    for rid, ids in prompts.items():
        assert got[rid] == reference(ids), rid


def test_prefix_cache_hits_on_a_shared_system_prompt(default_model_dir, tokenizer, reference) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(default_model_dir, block_size=8)
    prompts = {f"r{i}": encode(tokenizer, SYSTEM + p) for i, p in enumerate(PROMPTS[:4])}
    items = list(prompts.items())
    got = run_all(engine, {0: items[:1], 30: items[1:]})  # later ones find the first one's blocks
    assert engine.block_manager.num_hit_tokens > 0
    assert engine.stats().prefix_cache_hit_rate > 0
    for rid, ids in prompts.items():
        assert got[rid] == reference(ids), rid
    # The whole prompt cached: its last token is still computed, and the output is the same.
    again = run_all(engine, {0: [("again", prompts["r0"])]})
    assert again["again"] == reference(prompts["r0"])
    check_all_blocks_free(engine)


def test_forced_preemption_with_a_small_kv_budget(default_model_dir, tokenizer, reference) -> None:  # type: ignore[no-untyped-def]
    prompts = {f"r{i}": encode(tokenizer, p) for i, p in enumerate(PROMPTS)}
    longest = max(len(ids) for ids in prompts.values()) + NEW_TOKENS
    engine = make_engine(default_model_dir, block_size=4, num_blocks=-(-longest // 4) * 2 + 2,
                         enable_prefix_caching=False)
    got = run_all(engine, {0: list(prompts.items())})
    assert engine.stats().preemptions > 0
    for rid, ids in prompts.items():
        assert got[rid] == reference(ids), rid
    check_all_blocks_free(engine)


def test_seeded_sampling_is_the_same_alone_and_in_a_busy_batch(default_model_dir, tokenizer) -> None:  # type: ignore[no-untyped-def]
    sampling = SamplingParams(do_sample=True, temperature=0.9, top_p=0.95, top_k=50, seed=1234)
    ids = encode(tokenizer, PROMPTS[1])
    stopping = StoppingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)

    def sampled(others: int) -> list[int]:
        engine = make_engine(default_model_dir)
        for k in range(others):
            engine.add(f"o{k}", encode(tokenizer, PROMPTS[k % len(PROMPTS)]),
                       SamplingParams(do_sample=True, temperature=1.3, seed=k), stopping)
        engine.add("me", ids, sampling, stopping)
        out: list[int] = []
        while engine.has_unfinished():
            out += [e.token_id for e in engine.step() if e.request_id == "me" and e.token_id is not None]
        return out

    alone = sampled(0)
    assert len(alone) == NEW_TOKENS
    assert sampled(5) == alone


def test_resume_continues_like_an_uninterrupted_run(default_model_dir, tokenizer, reference) -> None:  # type: ignore[no-untyped-def]
    ids = encode(tokenizer, PROMPTS[0])
    full = reference(ids)
    engine = make_engine(default_model_dir)
    stopping = StoppingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    engine.add("r", ids, stopping=stopping, generated=full[:10])
    events = []
    while engine.has_unfinished():
        events += engine.step()
    assert [e.index for e in events] == list(range(10, NEW_TOKENS))
    assert [e.token_id for e in events] == full[10:]
    assert events[-1].generated_text == tokenizer.decode(full, skip_special_tokens=True)


def test_abort_frees_blocks_and_ends_with_an_event(default_model_dir, tokenizer) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(default_model_dir)
    stopping = StoppingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    engine.add("keep", encode(tokenizer, PROMPTS[0]), stopping=stopping)
    engine.add("drop", encode(tokenizer, PROMPTS[2]), stopping=stopping)
    for _ in range(3):
        engine.step()
    used_with_both = engine.stats().blocks_used
    [event] = engine.abort("drop")
    assert event.finish_reason is not None and event.finish_reason.value == "aborted"
    assert event.token_id is None and event.index == 3
    assert engine.stats().blocks_used < used_with_both
    assert engine.abort("drop") == []
    while engine.has_unfinished():
        engine.step()
    check_all_blocks_free(engine)
