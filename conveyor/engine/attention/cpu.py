"""Attention on CPU through the C++ kernels (conveyor/engine/native/), in place over the paged cache.

The cache layout is torch_paged.py's (K transposed per block and head), so the KV write, the decode
kernel and the prefill kernel read the blocks through the block tables without a gather: decode
attention is memory-bound, and a gather reads and writes every K/V byte before SDPA reads it again.
Each new token's K/V goes into the cache in one call (kv_write.cpp, rounding to a bfloat16 cache as
`Tensor.to` does); the decode rows go through paged_decode.cpp, all prefill chunks of a step
through one call of paged_prefill.cpp (query tiles x key blocks, online softmax, tasks over
(chunk, KV head, tile) on all threads).

Serves fp32 queries over an fp32 or bfloat16 cache (widened as it is loaded) where the kernels are
built; elsewhere the dispatch (attention/__init__.py) chooses torch_paged.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conveyor.engine.attention.base import AttentionBatch, AttentionGeometry, NativePlan
from conveyor.engine.block_tables import BlockTables
from conveyor.engine.native import paged_attention
from conveyor.engine.workspace import Workspace


def cpu_unavailable_reason(geometry: AttentionGeometry) -> str | None:
    """Why the C++ kernels cannot serve this geometry, or None when they can."""
    if geometry.device.type != "cpu":
        return "not a CPU device"
    if geometry.dtype != torch.float32 or geometry.cache_dtype not in (torch.float32, torch.bfloat16):
        return f"the kernels take float32 queries over a float32 or bfloat16 cache, not {geometry.dtype}"
    return paged_attention.unavailable_reason()


# Block tables are int32 rows of a persistent table (block_tables.py), past each sequence's blocks
# the scratch block (never read: the kernels stop at each row's context).


@dataclass(slots=True)
class _Decode:
    tables: torch.Tensor  # [rows, max_blocks]
    context: torch.Tensor  # [rows]


@dataclass(slots=True)
class _Prefill:
    tables: torch.Tensor  # [chunks, max_blocks]
    starts: torch.Tensor  # [chunks] position of each chunk's first row
    lens: torch.Tensor  # [chunks]


@dataclass(slots=True)
class CpuMeta:
    slots: torch.Tensor  # [T] cache slot of each new token
    decode: _Decode | None  # None: no decode rows
    prefill: _Prefill | None  # None: no prefill chunks; their rows follow the decode rows
    num_decode: int


class CpuAttention:
    name = "cpu"
    supports_graphs = False

    def __init__(self, geometry: AttentionGeometry) -> None:
        self.g = geometry
        self._output = Workspace(geometry.device, geometry.dtype)  # forward's result, reused
        self._tables = BlockTables(pad=geometry.scratch_block, device=geometry.device)

    def cache_shape(self) -> tuple[int, ...]:
        g = self.g
        return (g.num_blocks + 1, g.num_kv_heads, g.block_size, g.head_dim)

    def prepare(self, batch: AttentionBatch) -> CpuMeta:
        n = batch.num_decode
        decode = prefill = None
        rows = self._tables.rows(batch.block_tables)
        if n:
            decode = _Decode(self._padded(rows[:n], batch.context_lens[:n]),
                             torch.tensor(batch.context_lens[:n], dtype=torch.int32))
        if len(batch.query_lens) > n:
            lens, ctx = batch.query_lens[n:], batch.context_lens[n:]
            starts = [c - length for c, length in zip(ctx, lens, strict=True)]
            prefill = _Prefill(self._padded(rows[n:], ctx),
                               torch.tensor(starts, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32))
        return CpuMeta(slots=batch.slots, decode=decode, prefill=prefill, num_decode=n)

    def native_plan(self, meta: CpuMeta) -> NativePlan:
        """The step's attention as the model's C++ layer loop runs it."""
        d, p = meta.decode, meta.prefill
        return NativePlan(
            slots=meta.slots,
            decode_tables=None if d is None else d.tables,
            context=None if d is None else d.context,
            prefill_tables=None if p is None else p.tables,
            starts=None if p is None else p.starts,
            lens=None if p is None else p.lens,
            scale=self.g.scale,
        )

    def _padded(self, rows: list[int], context: list[int]) -> torch.Tensor:
        width = max(-(-ctx // self.g.block_size) for ctx in context)
        return self._tables.gather(rows, width)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: CpuMeta,
        window: int | None,
    ) -> torch.Tensor:
        # Write first: every query of this step must see its own token and the chunk before it.
        paged_attention.write_kv(k, v, k_cache, v_cache, meta.slots)
        # Reused by every layer: the o projection has read the last layer's output before the next
        # one writes it, and a fresh tensor per layer costs an allocation and page faults.
        out = self._output("out", q.shape)
        if (d := meta.decode) is not None:
            rows = slice(None) if meta.num_decode == q.shape[0] else slice(meta.num_decode)
            paged_attention.paged_decode(q[rows], k_cache, v_cache, d.tables, d.context, self.g.scale, window,
                                         out=out[rows])
        if (p := meta.prefill) is not None:
            first = meta.num_decode  # decode rows have one query each
            paged_attention.paged_prefill(q[first:], k_cache, v_cache, p.tables, p.starts, p.lens,
                                          self.g.scale, window, out=out[first:])
        return out.view(q.shape[0], self.g.num_heads * self.g.head_dim)
