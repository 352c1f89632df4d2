"""Which Llama forwards run their layer loop in one C++ call (native/layer_loop.cpp's LayerStack).

Built where every piece of a layer has its kernel here: CPU float32, the fused ops and the
attention kernels built (conveyor/engine/native/), the fused RMS norm reproducing F.rms_norm's bits,
SiLU, the GEMMs oneDNN's fp32 ones (linear.py). Elsewhere the forward keeps its Python loop: the
same kernels one call at a time, the same bits, slower. A step runs the C++ loop only when its
attention backend gives a plan for it (attention.native_plan: the CPU kernels' backend does).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from conveyor.engine.native import paged_attention

logger = logging.getLogger(__name__)

# Rows per slice of the MLP on CPU, in both loops (Llama._mlp says why).
MLP_ROWS = 512


class StackedModel(Protocol):
    """What the LayerStack is built from (the Llama model)."""

    fused: Any  # the fused ops' extension, None where it is not built
    norm_lanes: int
    silu: bool
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float

    @property
    def layers(self) -> Sequence[Any]: ...  # input_norm, qkv, o, post_norm, gate_up, down, window each


def build_layer_stack(model: StackedModel) -> Any:
    """The model's LayerStack, or None where the Python loop must run (see above; logged when the
    extension has the class but cannot build it, e.g. under a torch release whose private oneDNN
    op changed its signature)."""
    ls = model.layers
    gemms = [linear for la in ls for linear in (la.qkv, la.o, la.gate_up, la.down)]
    if (model.fused is None or not model.norm_lanes or not model.silu or paged_attention.load() is None
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
