"""Attention on CUDA: flash-attn's paged-KV kernels, and CUDA graphs for pure-decode steps.

flash_attn is imported when this backend is built, never when the module is imported, so CPU
installs never need it. Cache layout per layer is flash-attn's: [num_blocks + 1, block_size,
kv_heads, head_dim].

Never run on a GPU. On CPU, tests/engine/test_model_runner.py checks how FlashAttention calls
flash-attn against a plain-torch stand-in for flash-attn's documented API; the real kernels and
DecodeGraphs (CUDA graphs) are not tested. Check them on a CUDA machine with flash-attn
(`pip install 'conveyor[gpu]'`) before relying on them; without flash-attn, CUDA runs the torch
backend (torch_paged.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.attention import AttentionBatch, AttentionGeometry


@dataclass(slots=True)
class FlashMeta:
    slots: torch.Tensor  # [T] long: cache slot of each new token
    context_lens: torch.Tensor  # [N] int32
    block_table: torch.Tensor  # [N, width] int32
    decode_only: bool  # one query per sequence: flash_attn_with_kvcache, graph-capturable
    cu_q: torch.Tensor | None = None  # [N + 1] int32, varlen only
    cu_k: torch.Tensor | None = None
    max_q: int = 1
    max_k: int = 0


class FlashAttention:
    name = "flash-attn"

    def __init__(self, geometry: AttentionGeometry) -> None:
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        self.g = geometry
        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache

    def cache_shape(self) -> tuple[int, ...]:
        g = self.g
        return (g.num_blocks + 1, g.block_size, g.num_kv_heads, g.head_dim)

    def prepare(self, batch: AttentionBatch) -> FlashMeta:
        bs, device = self.g.block_size, self.g.device
        used = [-(-ctx // bs) for ctx in batch.context_lens]
        width = max(used)
        rows = [t[:u] + [0] * (width - u) for t, u in zip(batch.block_tables, used, strict=True)]
        meta = FlashMeta(
            slots=batch.slots,
            context_lens=torch.tensor(batch.context_lens, dtype=torch.int32, device=device),
            block_table=torch.tensor(rows, dtype=torch.int32, device=device),
            decode_only=batch.num_decode == len(batch.query_lens),
        )
        if not meta.decode_only:
            meta.cu_q = _cumulative(batch.query_lens, device)
            meta.cu_k = _cumulative(batch.context_lens, device)
            meta.max_q, meta.max_k = max(batch.query_lens), max(batch.context_lens)
        return meta

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: FlashMeta,
        window: int | None,
    ) -> torch.Tensor:
        g = self.g
        kv, hd = g.num_kv_heads, g.head_dim
        k_cache.view(-1, kv, hd).index_copy_(0, meta.slots, k)
        v_cache.view(-1, kv, hd).index_copy_(0, meta.slots, v)
        # flash-attn's window counts keys left of the query: q_pos - k_pos <= window - 1.
        window_size = (window - 1, 0) if window is not None else (-1, -1)
        q = q.contiguous()
        if meta.decode_only:
            out = self._with_kvcache(
                q.unsqueeze(1),
                k_cache,
                v_cache,
                cache_seqlens=meta.context_lens,
                block_table=meta.block_table,
                softmax_scale=g.scale,
                causal=True,
                window_size=window_size,
            )
        else:
            # Causal is aligned bottom-right: a chunk's rows see the cached context before them.
            out = self._varlen(
                q,
                k_cache,
                v_cache,
                cu_seqlens_q=meta.cu_q,
                cu_seqlens_k=meta.cu_k,
                max_seqlen_q=meta.max_q,
                max_seqlen_k=meta.max_k,
                softmax_scale=g.scale,
                causal=True,
                window_size=window_size,
                block_table=meta.block_table,
            )
        return out.reshape(q.shape[0], g.num_heads * hd)


def _cumulative(lengths: list[int], device: torch.device) -> torch.Tensor:
    sums = [0]
    for n in lengths:
        sums.append(sums[-1] + n)
    return torch.tensor(sums, dtype=torch.int32, device=device)


Forward = Callable[[torch.Tensor, torch.Tensor, FlashMeta], torch.Tensor]


class DecodeGraphs:
    """The model's forward captured for pure-decode batches of a few sizes.

    A batch of n rows replays the smallest captured size >= n. Padding rows write to and read from
    the cache's scratch block only, so they never touch a sequence's KV.
    """

    def __init__(
        self, forward: Forward, geometry: AttentionGeometry, max_batch: int, max_context: int
    ) -> None:
        g = geometry
        device = g.device
        self.sizes = sorted(
            {s for s in (1, 2, 4, 8, *range(16, max_batch + 1, 16)) if s <= max_batch} | {max_batch}
        )
        top, width = self.sizes[-1], -(-max_context // g.block_size)
        self.scratch_block, self.scratch_slot = g.scratch_block, g.scratch_block * g.block_size
        self.ids = torch.zeros(top, dtype=torch.long, device=device)
        self.positions = torch.zeros(top, dtype=torch.long, device=device)
        self.slots = torch.full((top,), self.scratch_slot, dtype=torch.long, device=device)
        self.context_lens = torch.ones(top, dtype=torch.int32, device=device)
        self.block_table = torch.full((top, width), self.scratch_block, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        for size in reversed(self.sizes):  # largest first: the smaller ones reuse its memory pool
            meta = FlashMeta(
                slots=self.slots[:size],
                context_lens=self.context_lens[:size],
                block_table=self.block_table[:size],
                decode_only=True,
            )
            forward(self.ids[:size], self.positions[:size], meta)  # warm-up: kernel choice, workspaces
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = forward(self.ids[:size], self.positions[:size], meta)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
        torch.cuda.synchronize(device)

    def run(self, ids: torch.Tensor, positions: torch.Tensor, meta: FlashMeta) -> torch.Tensor | None:
        """Hidden states [n, hidden], or None when no captured graph fits this batch."""
        n = ids.shape[0]
        size = next((s for s in self.sizes if s >= n), None)
        width = meta.block_table.shape[1]
        if size is None or not meta.decode_only or width > self.block_table.shape[1]:
            return None
        self.ids[:n].copy_(ids)
        self.positions[:n].copy_(positions)
        self.slots[:n].copy_(meta.slots)
        self.context_lens[:n].copy_(meta.context_lens)
        self.block_table[:n, :width].copy_(meta.block_table)
        # Rows n..size may hold a previous, larger batch: point them back at the scratch block.
        self.ids[n:size].zero_()
        self.positions[n:size].zero_()
        self.slots[n:size].fill_(self.scratch_slot)
        self.context_lens[n:size].fill_(1)
        self.block_table[n:size, 0].fill_(self.scratch_block)
        self.graphs[size].replay()
        return self.outputs[size][:n]
