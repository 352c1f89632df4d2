"""The attention interface every backend implements: the cache geometry, a step's batch, the
backend protocol, and the optional plan the model's C++ layer loop runs.

A step's batch is flattened without padding: the decode rows (one query each) come first, then the
prefill chunks one after another. `AttentionBatch` says where each sequence's rows are and what
context they see; a backend turns it once per step into its own metadata, which every layer reuses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True, slots=True)
class AttentionGeometry:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int  # usable blocks; block `num_blocks` is the cache's scratch block
    device: torch.device
    dtype: torch.dtype  # of queries, keys and values as the model computes them
    kv_dtype: torch.dtype | None = None  # the cache's element type; None: dtype

    @property
    def cache_dtype(self) -> torch.dtype:
        return self.kv_dtype or self.dtype

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5

    @property
    def scratch_block(self) -> int:
        return self.num_blocks


@dataclass(slots=True)
class AttentionBatch:
    """One step, in flattened order. Sequence i owns rows [sum(query_lens[:i]), ... + query_lens[i])."""

    num_decode: int  # the first num_decode sequences have exactly one query row
    query_lens: list[int]
    context_lens: list[int]  # start + length: the positions the last query row sees
    block_tables: list[list[int]]
    slots: torch.Tensor  # [num_tokens] long, on device: cache slot of each new token


@dataclass(frozen=True, slots=True)
class NativePlan:
    """A step's attention for the model's C++ layer loop (conveyor/engine/native/layer_loop.cpp): the
    decode rows through the paged decode kernel, then every prefill chunk in one paged prefill call."""

    slots: torch.Tensor  # [rows] int64
    decode_tables: torch.Tensor | None  # [decode rows, max_blocks] int32; None: no decode rows
    context: torch.Tensor | None  # [decode rows] int32
    prefill_tables: torch.Tensor | None  # [chunks, max_blocks] int32, rows after the decode rows; None: none
    starts: torch.Tensor | None
    lens: torch.Tensor | None
    scale: float


class AttentionBackend(Protocol):
    name: str
    supports_graphs: bool  # its pure-decode forward can be captured in a CUDA graph

    def cache_shape(self) -> tuple[int, ...]:
        """Shape of one layer's K (and V) tensor, scratch block included."""
        ...

    def prepare(self, batch: AttentionBatch) -> Any:
        """Everything that is the same for all layers of this step."""
        ...

    def forward(
        self,
        q: torch.Tensor,  # [T, heads, head_dim]
        k: torch.Tensor,  # [T, kv_heads, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: Any,
        window: int | None,  # sliding window (keys with q_pos - k_pos < window), None: full
    ) -> torch.Tensor:  # [T, heads * head_dim]
        """Writes k/v into the cache at the batch's slots, then attends."""
        ...


def native_plan(backend: AttentionBackend, meta: Any) -> NativePlan | None:
    """The step's attention as the C++ layer loop can run it, from a backend that offers one (an
    optional method: only the CPU kernels' backend has it), else None."""
    plan = getattr(backend, "native_plan", None)
    return None if plan is None else plan(meta)


# attend(q, k_cache, v_cache, meta, window) -> [T, heads * head_dim]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any, int | None], torch.Tensor]


def attend_after_write(backend: AttentionBackend) -> Attend | None:
    """The backend's attention alone, over a cache the caller has already written this step's K/V
    into at `meta.slots` (an optional method `attend`: only the CUDA backends have it, whose cache
    layout is cuda.cuda_layout), else None. The model's fused RoPE + KV write uses it."""
    return getattr(backend, "attend", None)
