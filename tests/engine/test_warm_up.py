"""The start-up warm-up (conveyor/engine/warm_up.py): a mixed step and a decode step that touch the
scratch block only — no usable block's K or V changes — and a warm-up that fails leaves the runner
to start anyway, saying why. (On CUDA it compiles the Triton kernels; here it runs the same steps.)"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from conveyor.engine.config import EngineConfig
from conveyor.engine.model_runner import ModelRunner
from conveyor.engine.step_plan import ScheduledChunk
from conveyor.engine.warm_up import warm_kernels


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                      max_position_embeddings=256)).eval()
    return ModelRunner(hf, EngineConfig(block_size=4, num_blocks=16, device="cpu"))


def test_the_warm_up_writes_only_the_scratch_block(runner: ModelRunner) -> None:
    cache = runner.cache
    blocks = cache.k[0].shape[0]
    assert blocks == cache.num_blocks + 1  # the usable blocks, then scratch
    for layer in (*cache.k, *cache.v):  # every usable block holds something a stray write would change
        layer.copy_(torch.randn_like(layer))
    before = [t[: cache.num_blocks].clone() for t in (*cache.k, *cache.v)]
    scratch_before = cache.k[0][cache.scratch_block].clone()
    steps: list[list[ScheduledChunk]] = []

    def execute(chunks: list[ScheduledChunk]) -> torch.Tensor:
        steps.append(chunks)
        return runner.execute(chunks)

    assert warm_kernels(execute, cache.scratch_block, runner.block_size, runner.device)
    assert [[c.length for c in step] for step in steps] == [[1, 4], [1]]  # mixed, then a decode alone
    after = [t[: cache.num_blocks] for t in (*cache.k, *cache.v)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert not torch.equal(cache.k[0][cache.scratch_block], scratch_before)  # the steps did write


def test_a_failed_warm_up_is_logged_and_not_fatal(runner: ModelRunner,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    def execute(chunks: list[ScheduledChunk]) -> torch.Tensor:
        raise RuntimeError("PTX too new for this driver")

    with caplog.at_level(logging.WARNING, logger="conveyor.engine.warm_up"):
        assert not warm_kernels(execute, runner.cache.scratch_block, runner.block_size, runner.device)
    assert "first requests compile them (RuntimeError: PTX too new for this driver)" in caplog.text
