"""Prompt logprobs against a plain Hugging Face forward (tiny random Llama, fp32 CPU): alone, in a
batch with requests that do not ask, over a chunked prefill, after a warm prefix cache, and for a
scoring-only request (max_new_tokens 0)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.events import TokenEvent
from conveyor.engine.params import SamplingParams, StoppingParams
from conveyor.engine.sequence import FinishReason

TOL = 1e-4


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def reference(hf, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """log_softmax of each position's logits, [len(ids), vocab]."""
    with torch.inference_mode():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def engine(model_dir: Path, **config) -> Engine:  # type: ignore[no-untyped-def]
    config = {"num_blocks": 64, "block_size": 4, "device": "cpu", "dtype": "float32", **config}
    return Engine.from_pretrained(model_dir, EngineConfig(**config))


def run(e: Engine) -> dict[str, list[TokenEvent]]:
    out: dict[str, list[TokenEvent]] = {}
    for _ in range(1000):
        if not e.has_unfinished():
            return out
        for event in e.step():
            out.setdefault(event.request_id, []).append(event)
    raise AssertionError("the engine did not finish")


def check(hf, ids: list[int], events: list[TokenEvent], k: int = 0) -> None:  # type: ignore[no-untyped-def]
    prompt = events[0].prompt_tokens
    assert prompt is not None and [p.id for p in prompt] == ids
    assert prompt[0].logprob is None and not prompt[0].top_tokens
    ref = reference(hf, ids)
    want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    got = torch.tensor([p.logprob for p in prompt[1:]])
    assert torch.allclose(got, want, atol=TOL), (got - want).abs().max()
    for pos, p in enumerate(prompt[1:]):
        assert len(p.top_tokens) == k
        if k:
            values, top_ids = ref[pos].topk(k)
            assert [t.id for t in p.top_tokens] == top_ids.tolist()
            assert torch.allclose(torch.tensor([t.logprob for t in p.top_tokens]), values, atol=TOL)
    assert all(e.prompt_tokens is None for e in events[1:])


PROMPT = list(range(1000, 1037))  # 37 tokens: 9 full blocks of 4 and one partial


def test_prompt_logprobs_equal_hf_in_a_mixed_batch(tiny_model_dir: Path, hf) -> None:  # type: ignore[no-untyped-def]
    e = engine(tiny_model_dir)
    e.add("scored", PROMPT, SamplingParams(prompt_logprobs=3), StoppingParams(max_new_tokens=3))
    e.add("plain", PROMPT[:20], SamplingParams(), StoppingParams(max_new_tokens=3))
    events = run(e)
    check(hf, PROMPT, events["scored"], k=3)
    assert all(ev.prompt_tokens is None for ev in events["plain"])
    assert [ev.index for ev in events["scored"]] == [0, 1, 2]


def test_chunked_prefill_accumulates_over_chunks(tiny_model_dir: Path, hf) -> None:  # type: ignore[no-untyped-def]
    e = engine(tiny_model_dir, max_batch_prefill_tokens=6)
    e.add("a", PROMPT, SamplingParams(prompt_logprobs=0), StoppingParams(max_new_tokens=2))
    e.add("b", PROMPT[5:30], SamplingParams(prompt_logprobs=1), StoppingParams(max_new_tokens=2))
    events = run(e)
    check(hf, PROMPT, events["a"])
    check(hf, PROMPT[5:30], events["b"], k=1)


def test_a_warm_prefix_cache_is_not_taken_for_scoring(tiny_model_dir: Path, hf) -> None:  # type: ignore[no-untyped-def]
    e = engine(tiny_model_dir)
    e.add("warm", PROMPT, SamplingParams(), StoppingParams(max_new_tokens=1))
    run(e)
    e.add("scored", PROMPT, SamplingParams(prompt_logprobs=0), StoppingParams(max_new_tokens=1))
    scored = run(e)["scored"]
    check(hf, PROMPT, scored)
    assert scored[-1].num_cached_tokens == 0
    e.add("hit", PROMPT, SamplingParams(), StoppingParams(max_new_tokens=1))
    assert run(e)["hit"][-1].num_cached_tokens > 0  # the cache was warm all along


def test_max_new_tokens_0_scores_only(tiny_model_dir: Path, hf) -> None:  # type: ignore[no-untyped-def]
    e = engine(tiny_model_dir, max_batch_prefill_tokens=8)
    e.add("score", PROMPT, SamplingParams(prompt_logprobs=0), StoppingParams(max_new_tokens=0))
    e.add("gen", PROMPT[:9], SamplingParams(), StoppingParams(max_new_tokens=4))
    events = run(e)
    (only,) = events["score"]
    assert only.token_id is None and only.index == 0
    assert only.finish_reason is FinishReason.LENGTH and only.num_generated_tokens == 0
    assert only.generated_text == ""
    check(hf, PROMPT, [only])
    assert len(events["gen"]) == 4
