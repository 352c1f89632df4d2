"""The CUDA attention backends and decode CUDA graphs. The GPU tests skip without a CUDA device
(scripts/gpu_check.sh runs them on one); the Triton kernels' CPU-interpreter tests are in
test_attention_triton.py."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from conveyor.engine.attention import AttentionGeometry
from conveyor.engine.attention.cuda import capture_decode_graphs, graph_sizes
from conveyor.engine.config import EngineConfig
from conveyor.engine.model_runner import ModelRunner
from conveyor.engine.sequence import Sequence
from conveyor.engine.step_plan import ScheduledChunk
from tests.engine.test_model_runner import SHAPE, Allocator, _drive

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_flash = pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash-attn")


def test_graph_sizes() -> None:
    assert graph_sizes(40, None) == [1, 2, 4, 8, 16, 32, 40]
    assert graph_sizes(8, None) == [1, 2, 4, 8]
    assert graph_sizes(64, (32, 1, 128, 0)) == [1, 32]  # cut to max_batch_size; 0 means none
    assert graph_sizes(64, ()) == []


def test_a_failed_graph_capture_leaves_eager_steps(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capture fails after its warm-up forward (here made to; on a GPU, running out of memory or a
    kernel that cannot be captured would): no graphs, one warning with the cause and the cost, and
    no exception to take the worker down."""

    def no_graph() -> None:
        raise RuntimeError("out of memory while capturing")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", no_graph)
    geometry = AttentionGeometry(num_heads=2, num_kv_heads=1, head_dim=4, block_size=4, num_blocks=3,
                                 device=torch.device("cpu"), dtype=torch.float32)  # fmt: skip
    warmups: list[int] = []

    def forward(ids: torch.Tensor, positions: torch.Tensor, meta: object) -> torch.Tensor:
        warmups.append(ids.shape[0])
        return torch.zeros(ids.shape[0], 8)

    with caplog.at_level(logging.WARNING, logger="conveyor.engine.attention.cuda"):
        assert capture_decode_graphs(forward, geometry, [1, 2], max_context=16) is None
    assert warmups == [2]  # the largest size first, and the failure stops the rest
    [record] = caplog.records
    assert "decode steps run eager" in record.getMessage()
    assert "RuntimeError: out of memory while capturing" in record.getMessage()


def _cuda_model(cls: type, config_cls: type, **extra: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(config_cls(**SHAPE, **extra)).eval().to("cuda")


@needs_cuda
@pytest.mark.parametrize(
    ("backend", "block_size"),
    [("triton", 16), ("triton", 256), pytest.param("flash-attn", 256, marks=needs_flash)],
)
@pytest.mark.parametrize(
    ("cls", "config_cls", "extra"),
    [(LlamaForCausalLM, LlamaConfig, {}), (MistralForCausalLM, MistralConfig, {"sliding_window": 6})],
)
def test_backend_matches_transformers_on_cuda(
    backend: str, block_size: int, cls: type, config_cls: type, extra: dict
) -> None:
    hf = _cuda_model(cls, config_cls, **extra)
    config = EngineConfig(block_size=block_size, num_blocks=64, device="cuda", dtype="float32",
                          attention=backend, cuda_graphs=())  # fmt: skip
    runner = ModelRunner(hf, config)
    assert runner.attention.name == backend and runner.graphs is None
    _drive(runner, hf, [(13, 5, 0, 5), (3, 64, 0, 8), (1, 64, 2, 3), (40, 40, 1, 4)])


@needs_cuda
def test_decode_graphs_replay_what_eager_computes() -> None:
    hf = _cuda_model(LlamaForCausalLM, LlamaConfig)
    config = EngineConfig(block_size=16, num_blocks=64, device="cuda", dtype="float32", attention="triton",
                          max_batch_size=8, cuda_graphs=(2, 8))  # fmt: skip
    runner = ModelRunner(hf, config)
    assert runner.graphs is not None and runner.graphs.sizes == [2, 8]
    alloc = Allocator(runner)
    seqs = [Sequence(f"r{i}", list(range(i + 1, i + 1 + n))) for i, n in enumerate([5, 30, 17])]
    for s in seqs:  # prefill all but the last prompt token, then decode that one
        alloc.cover(s, s.num_tokens)
        runner.execute([ScheduledChunk(s, 0, s.num_tokens - 1)])
        s.num_computed_tokens = s.num_tokens - 1
    decode = [ScheduledChunk(s, s.num_tokens - 1, 1) for s in seqs]
    replayed = runner.execute(decode)  # 3 rows: the size-8 graph, rows 3..7 on the scratch block
    graphs, runner.graphs = runner.graphs, None
    eager = runner.execute(decode)
    runner.graphs = graphs
    torch.testing.assert_close(replayed, eager, atol=1e-4, rtol=1e-4)
