"""The engine with conveyor/engine/native/fused_ops.cpp (and F.rms_norm) against the same engine on the torch
ops: the same tokens and the same logprobs, bit for bit, on the tiny model and the default one; and
the default model's greedy 64 tokens still Hugging Face `generate`'s."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.native import fused_ops
from conveyor.engine.params import StoppingParams

pytestmark = pytest.mark.slow

PROMPTS = [[1, 2, 3], list(range(100, 160)), [7] * 17, list(range(3000, 3301, 3))]
NEW_TOKENS = 64


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    if fused_ops.load() is None:
        pytest.skip("the fused ops could not be built here (see the logged warning)")


def generate(engine: Engine, fused: bool) -> dict[str, list[tuple[int, float | None]]]:
    """Tokens and logprobs of every prompt, all in one batch, on the chosen path."""
    model = engine.runner.model
    module = model.fused
    model.fused, model.fused_norm = (module if fused else None), fused
    try:
        for i, ids in enumerate(PROMPTS):
            engine.add(str(i), ids, stopping=StoppingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
        out: dict[str, list[tuple[int, float | None]]] = {}
        while engine.has_unfinished():
            for e in engine.step():
                if e.token_id is not None:
                    out.setdefault(e.request_id, []).append((e.token_id, e.logprob))
        return out
    finally:
        model.fused, model.fused_norm = module, True


@pytest.mark.parametrize("which", ["tiny", "default"])
def test_fused_ops_change_no_bit_of_the_output(which: str, tiny_model_dir: Path,
                                                default_model_dir: Path) -> None:
    path = tiny_model_dir if which == "tiny" else default_model_dir
    engine = Engine.from_pretrained(path, EngineConfig(enable_prefix_caching=False, device="cpu",
                                                       kv_cache_memory=64 * 1024**2))
    assert engine.runner.model.fused is not None
    fused = generate(engine, fused=True)
    assert [len(fused[str(i)]) for i in range(len(PROMPTS))] == [NEW_TOKENS] * len(PROMPTS)
    assert generate(engine, fused=False) == fused
    if which == "default":  # and greedy is still HF generate's, over 64 tokens
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        ids = PROMPTS[1]
        with torch.inference_mode():
            x = torch.tensor([ids])
            want = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, eos_token_id=None,
                               max_new_tokens=NEW_TOKENS, pad_token_id=0)[0, len(ids):].tolist()
        assert [t for t, _ in fused["1"]] == want
