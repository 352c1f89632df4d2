"""conveyor/engine/native/fused_ops.cpp against the torch ops the Llama forward ran before it (and still runs
without a compiler): rope bit for bit, silu_and_mul bit for bit where torch's vectorised kernel
runs (rows a multiple of 32 long, as every supported model's MLP is) and within 2 ulps in torch's
scalar tail, F.rms_norm bit for bit against the five-op norm, and the fused rms_norm bit for bit
against F.rms_norm; per row, so alone or in any batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conveyor.engine.native import fused_ops

ROWS = (1, 2, 7, 16, 63, 64, 65, 600)


@pytest.fixture(scope="module")
def ops():  # noqa: ANN201 - the compiled module
    module = fused_ops.load()
    if module is None:
        pytest.skip("the fused ops could not be built here (see the logged warning)")
    return module


def randn(*shape: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def torch_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    inter = gate_up.shape[1] // 2
    return F.silu(gate_up[:, :inter].clone(), inplace=True) * gate_up[:, inter:]


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("inter", [32, 128, 1536])
def test_silu_and_mul_is_torchs_bit_for_bit(ops, rows: int, inter: int) -> None:  # noqa: ANN001
    gate_up = randn(rows, 2 * inter, seed=rows + inter)
    gate_up[0, :4] = torch.tensor([0.0, -0.0, 100.0, -100.0])  # exp's edges: 1, overflow, underflow
    out = torch.full((rows, inter), float("nan"))
    ops.silu_and_mul(gate_up, out)
    assert torch.equal(out, torch_silu_and_mul(gate_up))


@pytest.mark.parametrize("inter", [1, 5, 17, 33, 100])
def test_silu_and_mul_in_any_row_length_within_two_ulps(ops, inter: int) -> None:  # noqa: ANN001
    gate_up = randn(9, 2 * inter, seed=inter)
    out = torch.empty(9, inter)
    ops.silu_and_mul(gate_up, out)
    torch.testing.assert_close(out, torch_silu_and_mul(gate_up), rtol=2.4e-7, atol=1e-30)


def test_silu_and_mul_reads_strided_rows_and_writes_a_strided_out(ops) -> None:  # noqa: ANN001
    wide = randn(40, 2 * 64 + 24, seed=1)
    gate_up = wide[:, 8 : 8 + 128]  # row stride 152
    out_wide = torch.zeros(40, 80)
    out = out_wide[:, 4:68]
    ops.silu_and_mul(gate_up, out)
    assert torch.equal(out, torch_silu_and_mul(gate_up))
    assert not out_wide[:, :4].any() and not out_wide[:, 68:].any()  # nothing written outside


def test_silu_and_mul_rows_do_not_depend_on_the_batch(ops) -> None:  # noqa: ANN001
    gate_up = randn(600, 2 * 100, seed=2)
    out = torch.empty(600, 100)
    ops.silu_and_mul(gate_up, out)
    for r in (0, 17, 599):
        alone = torch.empty(1, 100)
        ops.silu_and_mul(gate_up[r : r + 1], alone)
        assert torch.equal(alone[0], out[r])


def torch_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.py's torch path: rotate_half by a cat, then mul_ + addcmul."""
    rows, hd = cos.shape
    half = hd // 2
    x = qkv[:, : heads * hd].view(rows, heads, hd)
    rot = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return torch.addcmul(rot.mul_(sin[:, None]), x, cos[:, None])


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("heads", "hd", "extra"), [(12, 64, 192), (6, 16, 32), (3, 10, 0), (2, 128, 256)])
def test_rope_is_torchs_bit_for_bit(ops, rows: int, heads: int, hd: int, extra: int) -> None:  # noqa: ANN001
    qkv = randn(rows, heads * hd + extra, seed=rows * hd)  # v's columns after q and k: strided rows
    angle = randn(rows, hd, seed=7)
    cos, sin = angle.cos(), angle.sin()
    sin[:, : hd // 2].neg_()  # sign-folded, as Llama.rope gives it
    out = torch.full((rows, heads, hd), float("nan"))
    ops.rope(qkv, cos, sin, heads, out)
    assert torch.equal(out, torch_rope(qkv, cos, sin, heads))


def five_op_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", [64, 100, 576, 960])
def test_torch_rms_norm_is_the_five_op_norm_bit_for_bit(rows: int, hidden: int) -> None:
    x, weight = randn(rows, hidden, seed=rows), randn(hidden, seed=hidden, scale=1.0)
    got = F.rms_norm(x, (hidden,), weight, 1e-5)
    assert torch.equal(got, five_op_rms_norm(x, weight, 1e-5))
    assert torch.equal(F.rms_norm(x[-1:], (hidden,), weight, 1e-5)[0], got[-1])  # alone == in a batch


# Rows long enough for torch's sum to cascade (2048: 64 vector groups at 8 lanes; 16384 two
# levels), a scalar tail (100, 1000: not a multiple of 16), the default model's 576.
NORM_WIDTHS = [64, 100, 576, 960, 1000, 2048, 16384]


@pytest.mark.parametrize("hidden", NORM_WIDTHS)
def test_fused_rms_norm_is_f_rms_norm_bit_for_bit(ops, hidden: int) -> None:  # noqa: ANN001
    lanes = fused_ops.norm_lanes(hidden, 1e-5)
    assert lanes in (8, 16)  # a width was found at which every check row matched
    weight = randn(hidden, seed=hidden, scale=1.0)
    for rows, scale in ((1, 3.0), (7, 1e-4), (65, 40.0), (600, 1.0)):
        x = randn(rows, hidden, seed=rows + hidden, scale=scale)
        x[0, :3] = torch.tensor([0.0, 1e-30, -1e4])  # a zero, a denormal square, a large one
        out = torch.full_like(x, float("nan"))
        ops.rms_norm(x, weight, 1e-5, lanes, out)
        assert torch.equal(out, F.rms_norm(x, (hidden,), weight, 1e-5))


def test_fused_rms_norm_rows_do_not_depend_on_the_batch_and_read_strided_rows(ops) -> None:  # noqa: ANN001
    lanes = fused_ops.norm_lanes(576, 1e-6)
    wide, weight = randn(300, 600, seed=3), randn(576, seed=4, scale=1.0)
    x = wide[:, 10:586]  # row stride 600
    out = torch.empty(300, 576)
    ops.rms_norm(x, weight, 1e-6, lanes, out)
    assert torch.equal(out, F.rms_norm(x, (576,), weight, 1e-6))
    for r in (0, 150, 299):
        alone = torch.empty(1, 576)
        ops.rms_norm(x[r : r + 1], weight, 1e-6, lanes, alone)
        assert torch.equal(alone[0], out[r])


def test_fused_rms_norm_at_the_wrong_width_is_not_f_rms_norm(ops) -> None:  # noqa: ANN001
    # The order matters: the other width gives other bits, so norm_lanes' check can tell them apart.
    lanes = fused_ops.norm_lanes(576, 1e-5)
    x, weight = randn(64, 576, seed=5), randn(576, seed=6, scale=1.0)
    out = torch.empty_like(x)
    ops.rms_norm(x, weight, 1e-5, 24 - lanes, out)
    assert not torch.equal(out, F.rms_norm(x, (576,), weight, 1e-5))
    with pytest.raises(RuntimeError, match="lanes must be 8 or 16"):
        ops.rms_norm(x, weight, 1e-5, 4, out)


def test_only_a_float32_model_on_cpu_uses_them() -> None:
    assert fused_ops.for_model(torch.device("cpu"), torch.bfloat16) is None
