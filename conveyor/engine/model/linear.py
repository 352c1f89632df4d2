"""A linear layer's weight, held in the layout of the fastest GEMM the device has for it.

On CPU in float32 that is oneDNN with the weight reordered once, at load, into its blocked layout:
measured here (AMD EPYC, 2 threads) it runs the decode-sized GEMMs (64 rows) 1.2-1.6x faster than
MKL's sgemm, which torch.mm uses, and a large square matmul at 212 against 176 GFLOP/s. A row's
result does not depend on how many rows are in the batch, which seeded sampling relies on.
Elsewhere (CUDA, other dtypes, a torch built without oneDNN) it is torch.mm on the plain weight,
and so it is when oneDNN's ops (private to torch) give a result that differs from torch.mm's on a
small matrix, checked once at load.

`bf16=True` (the engine's gemm_dtype bfloat16, opt-in) keeps the weight in bfloat16 and runs the
GEMM in it (inputs
rounded to bfloat16, fp32 accumulation, outputs rounded to bfloat16 and widened back), on a CPU
with native bfloat16 dot products (AVX512_BF16 or AMX): ~1.6x the fp32 GEMMs' speed here and half
their memory traffic. Everything else (norms, attention, the KV cache, the logits) stays fp32, but
the outputs are no longer Hugging Face's fp32 ones; a row's result still does not depend on the batch.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

# Rows the weight is laid out for; oneDNN's reorder takes it as a hint, any row count works.
_PACK_ROWS = 64


@functools.cache
def onednn_available() -> bool:
    """oneDNN's prepacked fp32 linear is usable in this torch build and agrees with torch.mm
    (checked once, at the first load)."""
    return onednn_usable(torch.ops.mkldnn)


@functools.cache
def bf16_gemms() -> bool:
    """Whether this CPU and torch build can run the GEMMs in bfloat16 when asked (else it says
    why, once, and the GEMMs stay fp32)."""
    if not onednn_available():
        return False
    if not cpu_has_native_bf16():
        logger.warning("gemm_dtype bfloat16: this CPU has no AVX512_BF16 or AMX, where oneDNN would "
                       "emulate bfloat16 slower than fp32; the GEMMs stay fp32")
        return False
    reason = bf16_mismatch(torch.ops.mkldnn)
    if reason is not None:
        logger.warning("gemm_dtype bfloat16: oneDNN's bfloat16 linear is not used, the GEMMs stay fp32: %s",
                       reason)
        return False
    return True


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU computes bfloat16 dot products in hardware (Linux: its flags)."""
    try:
        flags = set(cpuinfo.read_text().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def bf16_mismatch(ops: Any) -> str | None:
    """Why oneDNN's bfloat16 linear differs from the same product in fp32 over bfloat16-rounded
    inputs by more than bfloat16's rounding, or None when it agrees."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 48, generator=g).to(torch.bfloat16)
    weight = torch.randn(24, 48, generator=g).to(torch.bfloat16)
    want = x.float() @ weight.float().t()
    try:
        got = ops._linear_pointwise(x, ops._reorder_linear_weight(weight, _PACK_ROWS), None, "none", [], "")
    except Exception as exc:  # noqa: BLE001 - any failure means: do not use it
        return f"the op failed on a 5x48 test matrix ({type(exc).__name__}: {exc})"
    # bfloat16 keeps 8 bits of mantissa: its outputs are rounded to that
    return _disagreement("bf16 linear", got, want, "the fp32 product of its inputs", 1e-2)


def _disagreement(name: str, out: object, ref: torch.Tensor, what: str, tolerance: float) -> str | None:
    """Why `out` is not `ref` within `tolerance` (relative to ref's largest value), or None."""
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return f"{name} on a 5x48 test matrix gave shape {shape}, {what} {tuple(ref.shape)}"
    error = (out.float() - ref).abs().max().item()
    if not error <= tolerance * (1 + ref.abs().max().item()):  # also catches NaN
        return f"{name} on a 5x48 test matrix differs from {what} by up to {error:.3g}"
    return None


def onednn_usable(ops: Any) -> bool:
    """Whether `ops` (torch.ops.mkldnn, or a stand-in in tests) has the prepacked linear and its
    results match torch's; logs why not when it has the ops but they cannot be trusted."""
    if not (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    ):
        return False
    reason = onednn_mismatch(ops)
    if reason is not None:
        logger.warning("not using oneDNN's prepacked linear, using torch.mm instead: %s", reason)
        return False
    return True


def onednn_mismatch(ops: Any) -> str | None:
    """Why the ops' results differ from torch.mm/addmm on a small matrix, or None when they agree.

    `_linear_pointwise` and `_reorder_linear_weight` are private torch ops, free to change meaning
    between releases: both calls Linear makes (plain and with a residual) are checked.
    """
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 48, generator=g)
    weight = torch.randn(24, 48, generator=g)
    bias = torch.randn(24, generator=g)
    h = torch.randn(5, 24, generator=g)
    want = torch.addmm(bias, x, weight.t())
    try:
        packed = ops._reorder_linear_weight(weight, _PACK_ROWS)
        got = ops._linear_pointwise(x, packed, bias, "none", [], "")
        got_residual = ops._linear_pointwise.binary(x, h, packed, bias, "add")
    except Exception as exc:  # noqa: BLE001 - any failure means: do not use it
        return f"the op failed on a 5x48 test matrix ({type(exc).__name__}: {exc})"
    for name, out, ref in (("linear", got, want), ("linear + residual", got_residual, h + want)):
        reason = _disagreement(name, out, ref, "torch.mm", 1e-4)
        if reason is not None:
            return reason
    return None


class Linear:
    """y = x @ weight.T (+ bias). `packed` weights are opaque: use them only through this class."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, bf16: bool = False) -> None:
        """`bf16`: run this fp32 CPU GEMM in bfloat16 where the CPU can (bf16_gemms)."""
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.packed = weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_available()
        self.bf16 = self.packed and bf16 and bf16_gemms()
        if self.bf16:
            weight = weight.to(torch.bfloat16)
            self.bias = None if bias is None else bias.to(torch.bfloat16)
        if self.packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _PACK_ROWS)
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x @ weight.T (+ bias); `out` is a buffer the plain path may write into (oneDNN allocates)."""
        if self.bf16:
            return self._bf16(x).float()
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if out is None:
            out = x.new_empty(x.shape[0], self.out_features)
        if self.bias is None:
            return torch.mm(x, self.weight.t(), out=out)
        return torch.addmm(self.bias, x, self.weight.t(), out=out)

    def residual(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """h + x @ weight.T (+ bias): a residual connection. The plain path adds in place into h
        and returns it; oneDNN adds inside the GEMM and returns a new tensor (in bfloat16, the fp32
        residual is added to in place)."""
        if self.bf16:
            return h.add_(self._bf16(x))
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise.binary(x, h, self.weight, self.bias, "add")
        h.addmm_(x, self.weight.t())  # the GEMM adds into the residual, no temporary
        if self.bias is not None:
            h += self.bias
        return h

    def _bf16(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def exact_min_rows(linears: Iterable[Linear], most: int) -> int:
    """The fewest rows a GEMM may be given so that every row's result is the same bits whatever
    the row count (at or above it), found for these weights on this CPU, at most `most`.

    A GEMM library picks its kernel by the row count, and some kernels round differently (MKL's
    sgemm below ~12 rows, oneDNN's at 1 row here): fewer rows are padded up to this count. It is
    checked, not assumed, since the choice depends on the CPU and the library's version: each
    distinct weight shape, plain and with a residual, at every row count below `most` against the
    same rows of a `most`-row call. torch.mm's path is not checked: it keeps `most`.
    """
    rows = 1
    seen: set[tuple[int, int, bool]] = set()
    for linear in linears:
        if not linear.packed:
            return most
        shape = (linear.out_features, linear.in_features, linear.bias is None)
        if shape in seen:
            continue
        seen.add(shape)
        g = torch.Generator().manual_seed(len(seen))
        x = torch.randn(most, linear.in_features, generator=g)
        h = torch.randn(most, linear.out_features, generator=g)
        plain, residual = linear(x), linear.residual(h.clone(), x)
        for m in range(most - 1, rows - 1, -1):  # down to the first row count that differs
            if not (torch.equal(linear(x[:m]), plain[:m])
                    and torch.equal(linear.residual(h[:m].clone(), x[:m]), residual[:m])):
                rows = m + 1
                break
    return rows
