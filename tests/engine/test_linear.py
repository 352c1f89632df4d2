"""conveyor.engine.model.linear: oneDNN's private ops are used only when they agree with torch.mm."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest
import torch

from conveyor.engine.model import linear
from conveyor.engine.model.linear import Linear, onednn_available, onednn_mismatch, onednn_usable

Op = Callable[..., torch.Tensor]


def _mm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())


class _Pointwise:
    """A stand-in for torch.ops.mkldnn._linear_pointwise on an unpacked weight."""

    def __init__(self, plain: Op | None = None, residual: Op | None = None) -> None:
        self.plain = plain or (lambda x, w, b, *_: _mm(x, w, b))
        self.residual = residual or (lambda x, h, w, b, _: h + _mm(x, w, b))

    def __call__(self, *args: object) -> torch.Tensor:
        return self.plain(*args)

    def binary(self, *args: object) -> torch.Tensor:
        return self.residual(*args)


class _Ops:
    def __init__(self, pointwise: _Pointwise) -> None:
        self._linear_pointwise = pointwise

    @staticmethod
    def _reorder_linear_weight(weight: torch.Tensor, rows: int) -> torch.Tensor:
        return weight  # "packed" is the plain weight: _Pointwise multiplies by it as it is


def _raise(*_: object) -> torch.Tensor:
    raise RuntimeError("could not create a primitive")


WRONG = {
    "off by 0.01": _Pointwise(plain=lambda x, w, b, *_: _mm(x, w, b) + 0.01),
    "bias dropped": _Pointwise(plain=lambda x, w, b, *_: _mm(x, w, None)),
    "residual not added": _Pointwise(residual=lambda x, h, w, b, _: _mm(x, w, b)),
    "NaN": _Pointwise(plain=lambda x, w, b, *_: torch.full((x.shape[0], w.shape[0]), float("nan"))),
    "transposed": _Pointwise(plain=lambda x, w, b, *_: _mm(x, w, b).t()),
    "raises": _Pointwise(plain=_raise),
}


@pytest.fixture
def mkldnn_build(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As if torch were built with oneDNN, so the result check is what decides."""
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    yield


def test_agreeing_ops_are_used(mkldnn_build: None) -> None:
    assert onednn_mismatch(_Ops(_Pointwise())) is None
    assert onednn_usable(_Ops(_Pointwise()))


@pytest.mark.parametrize("case", list(WRONG))
def test_wrong_results_fall_back_to_mm(
    case: str, mkldnn_build: None, caplog: pytest.LogCaptureFixture
) -> None:
    ops = _Ops(WRONG[case])
    reason = onednn_mismatch(ops)
    assert reason is not None and "5x48" in reason
    with caplog.at_level(logging.WARNING, logger=linear.__name__):
        assert not onednn_usable(ops)
    assert "using torch.mm instead" in caplog.text and reason in caplog.text


def test_a_wrong_op_at_load_leaves_linear_on_mm(
    mkldnn_build: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The whole decision, as a model load meets it: Linear packs nothing and computes with torch."""
    monkeypatch.setattr(torch.ops, "mkldnn", _Ops(WRONG["off by 0.01"]))
    onednn_available.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=linear.__name__):
            layer = Linear(torch.randn(8, 16), torch.randn(8))
        assert not layer.packed
        assert "differs from torch.mm" in caplog.text
        x = torch.randn(3, 16)
        torch.testing.assert_close(layer(x), torch.addmm(layer.bias, x, layer.weight.t()))
    finally:
        monkeypatch.undo()
        onednn_available.cache_clear()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
def test_this_torch_builds_ops_agree() -> None:
    """The real private ops pass the check here, so the CPU path is the fast one."""
    assert onednn_mismatch(torch.ops.mkldnn) is None


class _RowCountRounding:
    """A packed Linear stand-in whose results round differently below `exact_from` rows (small
    integers: its own GEMM is exact in any order)."""

    packed = True
    bias = None

    def __init__(self, exact_from: int, out_features: int = 8, in_features: int = 4) -> None:
        self.exact_from, self.out_features, self.in_features = exact_from, out_features, in_features
        self.weight = torch.randint(-3, 4, (out_features, in_features)).float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = x.round() @ self.weight.t()
        return y if x.shape[0] >= self.exact_from else y + 0.5

    def residual(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return h.round() + self(x)


def test_exact_min_rows_is_the_fewest_rows_every_shape_agrees_from() -> None:
    assert linear.exact_min_rows([_RowCountRounding(5)], 16) == 5
    # The largest over distinct shapes; a repeated shape is checked once.
    shapes = [_RowCountRounding(3), _RowCountRounding(7, 16, 4), _RowCountRounding(3)]
    assert linear.exact_min_rows(shapes, 16) == 7
    assert linear.exact_min_rows([_RowCountRounding(1)], 16) == 1
    plain = Linear(torch.randn(8, 4))
    plain.packed = False  # torch.mm's path: not checked, the bound
    assert linear.exact_min_rows([_RowCountRounding(1), plain], 16) == 16


@pytest.mark.skipif(not onednn_available(), reason="needs oneDNN's prepacked linear")
def test_this_cpus_onednn_rows_agree_from_the_count_found() -> None:
    # SmolLM2's MLP down projection's shape: oneDNN rounds a 1-row call differently here.
    g = torch.Generator().manual_seed(3)
    lin = Linear(torch.randn(576, 1536, generator=g) * 0.05)
    rows = linear.exact_min_rows([lin], 16)
    x = torch.randn(64, 1536, generator=g)
    full = lin(x)
    assert 1 <= rows <= 16
    assert all(torch.equal(lin(x[:m]), full[:m]) for m in range(rows, 64))


def test_native_bf16_is_read_from_the_cpus_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n")
    assert not linear.cpu_has_native_bf16(info)
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    assert linear.cpu_has_native_bf16(info)
    info.write_text("flags\t\t: fpu avx2 amx_tile amx_bf16\n")
    assert linear.cpu_has_native_bf16(info)
    assert not linear.cpu_has_native_bf16(tmp_path / "missing")


def test_a_wrong_bf16_op_is_refused() -> None:
    assert linear.bf16_mismatch(_Ops(_Pointwise())) is None
    for name in ("NaN", "transposed", "raises"):
        assert linear.bf16_mismatch(_Ops(WRONG[name])) is not None, name
    off = _Pointwise(plain=lambda x, w, b, *_: _mm(x, w, b) + 1.0)
    assert "differs" in (linear.bf16_mismatch(_Ops(off)) or "")


def test_bf16_is_off_unless_asked() -> None:
    layer = Linear(torch.randn(8, 16))
    assert not layer.bf16
    assert layer(torch.randn(3, 16)).dtype == torch.float32


def test_bf16_linear_is_the_bf16_product_and_batch_invariant(bf16_gemms: None) -> None:
    g = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(96, 64, generator=g) * 0.1, torch.randn(96, generator=g)
    layer = Linear(weight, bias, bf16=True)
    head = Linear(weight)  # the lm_head's: stays fp32
    assert layer.bf16 and not head.bf16
    x, h = torch.randn(40, 64, generator=g), torch.randn(40, 96, generator=g)
    want = x.bfloat16().float() @ weight.bfloat16().float().t() + bias.bfloat16().float()
    got = layer(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    assert not torch.equal(got, torch.addmm(bias, x, weight.t()))  # it did run in bfloat16
    torch.testing.assert_close(layer.residual(h.clone(), x), h + got, rtol=1e-5, atol=1e-5)
    rows = linear.exact_min_rows([layer], 16)
    assert all(torch.equal(layer(x[:m]), got[:m]) for m in range(rows, 40))
