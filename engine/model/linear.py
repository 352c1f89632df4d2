"""A linear layer's weight, held in the layout of the fastest GEMM the device has for it.

On CPU in float32 that is oneDNN with the weight reordered once, at load, into its blocked layout:
measured here (AMD EPYC, 2 threads) it runs the decode-sized GEMMs (64 rows) 1.2-1.6x faster than
MKL's sgemm, which torch.mm uses, and a large square matmul at 212 against 176 GFLOP/s. A row's
result does not depend on how many rows are in the batch, which seeded sampling relies on.
Elsewhere (CUDA, other dtypes, a torch built without oneDNN, CONVEYOR_CPU_GEMM=torch) it is
torch.mm on the plain weight.
"""

from __future__ import annotations

import functools
import logging
import os

import torch

logger = logging.getLogger(__name__)

ENV = "CONVEYOR_CPU_GEMM"
# Rows the weight is laid out for; oneDNN's reorder takes it as a hint, any row count works.
_PACK_ROWS = 64


@functools.cache
def onednn_available() -> bool:
    """oneDNN's prepacked fp32 linear is usable in this torch build and not turned off."""
    choice = os.environ.get(ENV, "onednn").strip().lower()
    if choice == "torch":
        return False
    if choice != "onednn":
        logger.warning("%s=%r is not 'torch' or 'onednn'; using oneDNN where it is available", ENV, choice)
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


class Linear:
    """y = x @ weight.T (+ bias). `packed` weights are opaque: use them only through this class."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.packed = weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_available()
        if self.packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _PACK_ROWS)
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x @ weight.T (+ bias); `out` is a buffer the plain path may write into (oneDNN allocates)."""
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if out is None:
            out = x.new_empty(x.shape[0], self.out_features)
        if self.bias is None:
            return torch.mm(x, self.weight.t(), out=out)
        return torch.addmm(self.bias, x, self.weight.t(), out=out)

    def residual(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """h + x @ weight.T (+ bias): a residual connection. The plain path adds in place into h
        and returns it; oneDNN adds inside the GEMM and returns a new tensor."""
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise.binary(x, h, self.weight, self.bias, "add")
        h.addmm_(x, self.weight.t())  # the GEMM adds into the residual, no temporary
        if self.bias is not None:
            h += self.bias
        return h
