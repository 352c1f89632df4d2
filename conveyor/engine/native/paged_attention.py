"""Typed calls of the C++ paged attention kernels (paged_decode.cpp, paged_prefill.cpp) and the KV
write (kv_write.cpp): one extension (extensions.ATTENTION), built on first use."""

from __future__ import annotations

from types import ModuleType

import torch

from conveyor.engine.native import extensions


def load() -> ModuleType | None:
    """The compiled module, or None when it cannot be built (logged once)."""
    return extensions.load(extensions.ATTENTION)


def unavailable_reason() -> str | None:
    return extensions.unavailable_reason(extensions.ATTENTION)


def _module() -> ModuleType:
    module = load()
    if module is None:
        raise RuntimeError(f"the CPU attention kernels are not built: {unavailable_reason()}")
    return module


def simd() -> str:
    """The widest SIMD paths compiled in: avx512, avx2 or scalar."""
    return str(_module().simd())


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    context: torch.Tensor,
    scale: float,
    window: int | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """[rows, heads, head_dim] attention of one query per row over its paged context, into `out`
    when given. q's and out's rows may be strided (each row's heads contiguous)."""
    window_ = -1 if window is None else window
    return _module().paged_decode(q, k_cache, v_cache, tables, context, scale, window_, out=out)


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    starts: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
    window: int | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """[rows, heads, head_dim] causal attention of every prefill chunk's rows over its paged
    context (the chunk's own keys already written to the cache), into `out` when given. q's rows
    may be strided (each row's heads contiguous)."""
    _module()  # registers the op
    out = torch.empty(q.shape, dtype=q.dtype) if out is None else out
    torch.ops.conveyor.paged_prefill(
        q, k_cache, v_cache, tables, starts, lens, scale, -1 if window is None else window, out
    )
    return out


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """k, v [tokens, kv_heads, head_dim] (fp32, rows may be strided) into the caches (fp32 or
    bfloat16, rounded as `Tensor.to` rounds) at `slots` [tokens] (int64), in one call."""
    _module()  # registers the op
    torch.ops.conveyor.write_kv(k, v, k_cache, v_cache, slots)
