"""The Llama forward's fused elementwise ops on CPU (fused_ops.cpp) and its C++ layer loop
(layer_loop.cpp): one extension (extensions.FUSED), built on first use.

silu_and_mul writes silu(gate) * up from the gate_up GEMM's output straight into the contiguous
buffer the down GEMM reads; rope rotates q and k together from the qkv GEMM's output; rms_norm is
F.rms_norm in one pass instead of its five ops (pow, sum, div, add + rsqrt, two muls), with the
same bits: its sum follows the order of torch's CPU sum kernel, whose vector width is found by
trying it against F.rms_norm at load (norm_lanes), and if neither width gives F.rms_norm's bits
the forward keeps F.rms_norm. LayerStack is the forward's loop over the layers in one C++ call, on
these ops, oneDNN's linear and the attention kernels. If the extension cannot be built the forward
keeps its torch ops and its Python loop: slower, same results (rope bit for bit; silu_and_mul
within an ulp of torch's, see the .cpp).
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

import torch
import torch.nn.functional as F

from conveyor.engine.native import extensions

logger = logging.getLogger(__name__)


def load() -> ModuleType | None:
    """The compiled module, or None when it cannot be built (logged once)."""
    return extensions.load(extensions.FUSED)


@functools.cache
def norm_lanes(hidden: int, eps: float) -> int:
    """The vector width (8 or 16) at which fused_ops.cpp's rms_norm gives F.rms_norm's bits for rows
    of `hidden` floats here, or 0 when it is not built or neither width does (logged: F.rms_norm
    stays). torch sums a row in an order set by its CPU kernel's vector width (8 here under torch
    2.13 on an AVX-512 CPU, where 16 differs in most rows), so it is measured, not assumed."""
    module = load()
    if module is None or hidden < 16:
        return 0
    g = torch.Generator().manual_seed(hidden)
    weight = torch.randn(hidden, generator=g)
    cases = [torch.randn(rows, hidden, generator=g) * scale
             for rows, scale in ((1, 1.0), (7, 1e-3), (64, 30.0), (600, 1.0))]
    wanted = [F.rms_norm(x, (hidden,), weight, eps) for x in cases]
    for lanes in (8, 16):
        got = []
        for x in cases:
            out = torch.empty_like(x)
            module.rms_norm(x, weight, eps, lanes, out)
            got.append(out)
        if all(torch.equal(a, b) for a, b in zip(got, wanted, strict=True)):
            return lanes
    logger.warning("the fused rms_norm does not give F.rms_norm's bits for rows of %d here (torch %s): "
                   "F.rms_norm is used", hidden, torch.__version__)
    return 0


def for_model(device: torch.device, dtype: torch.dtype) -> ModuleType | None:
    """The module when a model on `device` in `dtype` can use it (CPU, float32, built), else None."""
    return load() if device.type == "cpu" and dtype == torch.float32 else None
