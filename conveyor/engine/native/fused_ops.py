"""The Llama forward's fused elementwise ops on CPU (fused_ops.cpp), built on first use.

silu_and_mul writes silu(gate) * up from the gate_up GEMM's output straight into the contiguous
buffer the down GEMM reads; rope rotates q and k together from the qkv GEMM's output; rms_norm is
F.rms_norm in one pass instead of its five ops (pow, sum, div, add + rsqrt, two muls), with the
same bits: its sum follows the order of torch's CPU sum kernel, whose vector width is found by
trying it against F.rms_norm at load (norm_lanes), and if neither width gives F.rms_norm's bits
the forward keeps F.rms_norm. The same module holds LayerStack (layer_loop.cpp): the forward's
loop over the layers in one C++ call, on these ops, oneDNN's linear and the attention kernels. Built into
the same cache as the attention kernel (conveyor/engine/attention/cpu_kernel.py: keyed by torch version,
CPU flags and source). CONVEYOR_CPU_FUSED=torch turns them off (for side-by-side benchmarks); if
they cannot be built the forward logs it once and keeps its torch ops: slower, same results
(rope bit for bit; silu_and_mul within an ulp of torch's, see the .cpp).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from conveyor.engine import native_build
from conveyor.engine.attention import cpu_kernel

logger = logging.getLogger(__name__)

ENV = "CONVEYOR_CPU_FUSED"
_SOURCE = Path(__file__).with_name("fused_ops.cpp")
_LOOP = Path(__file__).with_name("layer_loop.cpp")  # the layer loop, in the same module
_HEADER = Path(__file__).with_name("fused_ops.h")


def enabled() -> bool:
    """Whether the fused path is wanted (not turned off by CONVEYOR_CPU_FUSED=torch)."""
    choice = os.environ.get(ENV, "kernel").strip().lower()
    if choice not in ("torch", "kernel"):
        logger.warning("%s=%r is not 'torch' or 'kernel'; using the kernel", ENV, choice)
    return choice != "torch"


@functools.cache
def load() -> ModuleType | None:
    """The compiled module, or None when it is turned off or cannot be built (logged once)."""
    if not enabled():
        return None
    build = cpu_kernel.build_dir("fused_ops", [_SOURCE, _LOOP, _HEADER])
    if not any(build.glob("*.so")):
        logger.info("compiling the model's fused ops (one time, ~15 s) into %s", build)
    try:
        # No FMA contraction beyond the explicit ones: rope rounds as torch's mul_ + addcmul.
        return native_build.load("conveyor_fused_ops", [_SOURCE, _LOOP], build,
                                 ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"])
    except Exception as exc:  # noqa: BLE001 - any build failure must leave the torch path working
        last = (str(exc).strip().splitlines() or [""])[-1]
        logger.warning("could not build the model's fused ops, using torch's (%s: %s); %s, or set %s=torch",
                       type(exc).__name__, last, cpu_kernel.INSTALL_HINT, ENV)
        return None


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
    """The module when a model on `device` in `dtype` can use it (CPU, float32), else None."""
    return load() if device.type == "cpu" and dtype == torch.float32 else None
