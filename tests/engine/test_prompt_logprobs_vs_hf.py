"""The prompt logprobs of 20 prompts on the default model equal a plain Hugging Face forward's within
1e-4 (fp32 CPU), computed in one batch with a small prefill budget (so prompts span chunks) and a
prefix cache that the first prompts warm."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.params import SamplingParams, StoppingParams
from tests.engine.test_engine_vs_hf import PROMPTS, SYSTEM

pytestmark = pytest.mark.slow

TOL = 1e-4
TEXTS = [*PROMPTS, *(SYSTEM + p for p in PROMPTS), "The", "1 2 3 4 5 6 7 8 9", "Ünïcödé ✓ 中文 🙂",
         "def f(x):\n    return x * 2\n", "Paris is the capital of", "A B", "Once upon a time, there was",
         "Roses are red, violets are"]


def test_prompt_logprobs_of_20_prompts_equal_hf(default_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from conveyor.engine.loader import load_tokenizer

    assert len(TEXTS) == 20
    tokenizer = load_tokenizer(default_model_dir)
    prompts = [tokenizer(t)["input_ids"] for t in TEXTS]
    engine = Engine.from_pretrained(default_model_dir, EngineConfig(
        kv_cache_memory=64 * 1024**2, max_batch_prefill_tokens=48, dtype="float32", device="cpu"))
    warm = {f"warm{i}": prompts[6 + i] for i in range(3)}  # SYSTEM + ...: shared full blocks
    for rid, ids in warm.items():
        engine.add(rid, ids, SamplingParams(), StoppingParams(max_new_tokens=1))
    while engine.has_unfinished():
        engine.step()
    for i, ids in enumerate(prompts):
        engine.add(str(i), ids, SamplingParams(prompt_logprobs=1), StoppingParams(max_new_tokens=1))
    got: dict[str, list[float | None]] = {}
    while engine.has_unfinished():
        for event in engine.step():
            if event.prompt_tokens is not None:
                got[event.request_id] = [p.logprob for p in event.prompt_tokens]
    hf = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    worst = 0.0
    for i, ids in enumerate(prompts):
        with torch.inference_mode():
            ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
        want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:], dtype=torch.long)]
        assert got[str(i)][0] is None and len(got[str(i)]) == len(ids)
        worst = max(worst, (torch.tensor(got[str(i)][1:]) - want).abs().max().item() if len(ids) > 1 else 0.0)
    assert worst <= TOL, worst
