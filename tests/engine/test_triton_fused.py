"""The fused Triton kernels of the model's CUDA path (conveyor/engine/model/triton_fused.py) against
the unfused torch ops they replace, in fp32 under Triton's CPU interpreter (TRITON_INTERPRET=1, set
by tests/conftest.py): head dims 64 and 128, GQA groups 1 and 4, KV written to scattered slots."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
from conveyor.engine.attention.cuda import write_kv  # noqa: E402
from conveyor.engine.model import triton_fused  # noqa: E402


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _unfused_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As Llama._rms_norm off the CPU (transformers' order)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@pytest.mark.parametrize("hidden", [64, 200])  # 200: a row that is not a power of two, masked
def test_rms_norm_matches_torch(hidden: int) -> None:
    x = torch.randn(7, hidden, generator=_gen(0)) * 3
    weight = torch.randn(hidden, generator=_gen(1))
    out = torch.full_like(x, float("nan"))
    triton_fused.rms_norm(x, weight, 1e-5, out)
    torch.testing.assert_close(out, _unfused_norm(x, weight, 1e-5))


def test_add_rms_norm_updates_the_residual_and_normalises_it() -> None:
    x = torch.randn(5, 96, generator=_gen(2))
    residual = torch.randn(5, 96, generator=_gen(3))
    weight = torch.randn(96, generator=_gen(4))
    want_residual = residual + x
    want = _unfused_norm(want_residual, weight, 1e-6)
    out = torch.empty_like(x)
    normed, updated = triton_fused.add_rms_norm(x, residual, weight, 1e-6, out)
    assert normed is out and updated is residual  # in place, as the model's buffers expect
    torch.testing.assert_close(residual, want_residual)
    torch.testing.assert_close(out, want)


def test_silu_and_mul_matches_torch() -> None:
    inter = 1100  # more than one program's columns, the last cut short
    gate_up = torch.randn(3, 2 * inter, generator=_gen(5)) * 4
    out = torch.full((3, inter), float("nan"))
    triton_fused.silu_and_mul(gate_up, out)
    torch.testing.assert_close(out, F.silu(gate_up[:, :inter]) * gate_up[:, inter:])


def _rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' q * cos + rotate_half(q) * sin, with the plain (unfolded) sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


@pytest.mark.parametrize(("head_dim", "heads", "kv"), [(64, 4, 4), (64, 8, 2), (128, 2, 2), (128, 8, 2)])
def test_rope_and_kv_write_match_the_unfused_ops(head_dim: int, heads: int, kv: int) -> None:
    """Groups heads // kv of 1 and 4; two padding rows past the slots are left alone."""
    rows, padded, num_blocks, block_size = 5, 7, 6, 4
    qkv = torch.randn(padded, (heads + 2 * kv) * head_dim, generator=_gen(head_dim + heads))
    angles = torch.rand(padded, head_dim // 2, generator=_gen(7)) * 6
    cos, sin = torch.cat((angles.cos(),) * 2, -1), torch.cat((angles.sin(),) * 2, -1)
    half = head_dim // 2
    folded = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # as Llama.rope gives it
    slots = torch.tensor([9, 0, 22, 3, 17])  # scattered over the blocks, one block left untouched
    shape = (num_blocks + 1, block_size, kv, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=_gen(8)), torch.randn(shape, generator=_gen(9))
    want_k, want_v = k_cache.clone(), v_cache.clone()
    x = qkv.view(padded, heads + 2 * kv, head_dim)
    want_q = _rope_reference(x[:rows, :heads], cos[:rows], sin[:rows])
    write_kv(_rope_reference(x[:rows, heads : heads + kv], cos[:rows], sin[:rows]), x[:rows, heads + kv :],
             want_k, want_v, slots)  # fmt: skip
    q = torch.full((rows, heads, head_dim), float("nan"))
    triton_fused.rope_write_kv(qkv, cos, folded, q, k_cache, v_cache, slots)
    torch.testing.assert_close(q, want_q)
    torch.testing.assert_close(k_cache, want_k)
    torch.testing.assert_close(v_cache, want_v)


def test_rope_write_kv_rejects_a_mismatched_cache() -> None:
    qkv = torch.zeros(2, (4 + 2 * 2) * 64)
    cache = torch.zeros(3, 4, 2, 32)
    cos = sin = torch.zeros(2, 64)
    slots = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="does not hold 4 q and 2 KV heads"):
        triton_fused.rope_write_kv(qkv, cos, sin, torch.zeros(2, 4, 64), cache, cache, slots)


def test_the_cuda_backends_run_the_model_through_the_fused_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton backend (on CPU under the interpreter, standing in for CUDA) takes the fused loop,
    which matches transformers as the unfused one does; the CPU backends never take it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from conveyor.engine.config import EngineConfig
    from conveyor.engine.model_runner import ModelRunner
    from tests.engine.test_model_runner import SHAPE, _drive

    calls: list[int] = []
    real = triton_fused.rope_write_kv
    monkeypatch.setattr(triton_fused, "rope_write_kv", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(Qwen2Config(**SHAPE)).eval()  # q/k/v biases
    runner = ModelRunner(hf, EngineConfig(block_size=4, num_blocks=128, device="cpu", attention="triton"))
    assert _drive(runner, hf, [(9, 4, 0, 3), (2, 64, 1, 2)]) == 5
    assert len(calls) == 2 * 5  # two layers, five steps
    calls.clear()
    cpu = ModelRunner(hf, EngineConfig(block_size=4, num_blocks=128, device="cpu"))
    _drive(cpu, hf, [(3, 64, 0, 1)])
    assert calls == []
