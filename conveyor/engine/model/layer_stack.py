"""Which Llama forwards run their layer loop in one C++ call (layer_loop.cpp's LayerStack).

Built where every piece of a layer has its kernel here: CPU float32, the fused ops (fused_ops.py)
and both attention kernels (conveyor/engine/attention/cpu_kernel.py) built, the fused RMS norm reproducing
F.rms_norm's bits, SiLU, the GEMMs oneDNN's fp32 ones (linear.py). Elsewhere, or under
CONVEYOR_CPU_LAYER_LOOP=python, the forward keeps its Python loop: the same kernels one call at a
time, the same bits, slower.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from conveyor.engine.attention import cpu_kernel

if TYPE_CHECKING:
    from conveyor.engine.model.llama import Llama

logger = logging.getLogger(__name__)

ENV = "CONVEYOR_CPU_LAYER_LOOP"  # "python": the forward's Python loop, not layer_loop.cpp
# Rows per slice of the MLP on CPU, in both loops (Llama._mlp says why).
MLP_ROWS = 512


def build_layer_stack(model: Llama) -> Any:
    """The model's LayerStack, or None where the Python loop must run (see above; logged when the
    extension has the class but cannot build it, e.g. under a torch release whose private oneDNN
    op changed its signature)."""
    if os.environ.get(ENV, "cpp").strip().lower() == "python":
        return None
    ls = model.layers
    gemms = [linear for la in ls for linear in (la.qkv, la.o, la.gate_up, la.down)]
    if (model.fused is None or not model.norm_lanes or not model.silu or cpu_kernel.load() is None
            or not all(linear.packed and not linear.bf16 for linear in gemms)):
        return None
    try:
        return model.fused.LayerStack(
            [la.input_norm for la in ls], [la.qkv.weight for la in ls], [la.o.weight for la in ls],
            [la.post_norm for la in ls], [la.gate_up.weight for la in ls], [la.down.weight for la in ls],
            [la.qkv.bias for la in ls], [la.o.bias for la in ls], [la.gate_up.bias for la in ls],
            [la.down.bias for la in ls], [-1 if la.window is None else la.window for la in ls],
            model.num_heads, model.num_kv_heads, model.head_dim, model.eps, model.norm_lanes, MLP_ROWS,
        )
    except RuntimeError as exc:
        logger.warning("the C++ layer loop cannot run here, the forward keeps its Python loop: %s",
                       (str(exc).strip().splitlines() or [""])[0])
        return None
