"""Attention over the paged KV cache, one backend per device kind, chosen here (select_attention).

cpu.py: the C++ kernels on CPU; flash.py and triton_paged.py: CUDA's; torch_paged.py: plain torch
on any device, the fallback of the others. The model asks its backend through AttentionBackend
(and native_plan) only, and imports none of them.

The interface (geometry, batch, backend protocol, native plan, attend_after_write) is base.py's,
re-exported here.
"""

from __future__ import annotations

import importlib.util
import logging

from conveyor.engine.attention.base import (
    Attend,
    AttentionBackend,
    AttentionBatch,
    AttentionGeometry,
    NativePlan,
    attend_after_write,
    native_plan,
)

__all__ = ["Attend", "AttentionBackend", "AttentionBatch", "AttentionGeometry", "NativePlan", "native_plan",
           "attend_after_write", "select_attention", "flash_unavailable_reason", "ATTENTION_CHOICES"]

logger = logging.getLogger(__name__)


def flash_unavailable_reason(geometry: AttentionGeometry) -> str | None:
    """Why flash-attn's paged kernels cannot serve this geometry, or None when they can."""
    if geometry.device.type != "cuda":
        return "not a CUDA device"
    if importlib.util.find_spec("flash_attn") is None:
        return "flash-attn is not installed (pip install 'conveyor[flash-attn]', which compiles it)"
    # Upstream flash-attn 2 rejects paged KV blocks that are not a multiple of 256 tokens.
    if geometry.block_size % 256:
        return f"flash-attn paged KV needs block_size to be a multiple of 256, got {geometry.block_size}"
    return None


ATTENTION_CHOICES = ("auto", "flash-attn", "triton", "torch")


def select_attention(geometry: AttentionGeometry, choice: str = "auto") -> AttentionBackend:
    """The backend `choice` names; `auto`: on CUDA flash-attn when it can run, else the Triton
    kernels, else plain torch (with a warning); on CPU the C++ kernels where they are built, else
    plain torch; `torch`: plain torch on any device."""
    from conveyor.engine.attention.triton_paged import triton_unavailable_reason

    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_CHOICES)}, got {choice!r}")
    if choice == "auto" and geometry.device.type == "cuda":
        flash, triton = flash_unavailable_reason(geometry), triton_unavailable_reason(geometry)
        choice = "flash-attn" if flash is None else "triton" if triton is None else "torch"
        if choice == "torch":
            logger.warning("using torch attention on CUDA, which is much slower: %s; %s", flash, triton)
    if choice == "auto" and geometry.device.type == "cpu":
        from conveyor.engine.attention.cpu import CpuAttention, cpu_unavailable_reason

        # Built (or loaded from its cache) here, at startup, rather than inside the first step.
        if (reason := cpu_unavailable_reason(geometry)) is None:
            return CpuAttention(geometry)
        logger.info("using torch attention on CPU: %s", reason)
    if choice == "flash-attn":
        if (reason := flash_unavailable_reason(geometry)) is not None:
            raise ValueError(f"attention flash-attn cannot run: {reason}; use --attention auto")
        from conveyor.engine.attention.flash import FlashAttention

        return FlashAttention(geometry)
    if choice == "triton":
        if (reason := triton_unavailable_reason(geometry)) is not None:
            raise ValueError(f"attention triton cannot run: {reason}; use --attention auto")
        from conveyor.engine.attention.triton_paged import TritonAttention

        return TritonAttention(geometry)
    from conveyor.engine.attention.torch_paged import TorchAttention

    return TorchAttention(geometry)
