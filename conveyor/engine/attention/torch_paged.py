"""Attention in plain torch over the paged cache: any device (the fallback of CPU's and CUDA's kernels).

Cache layout per layer: V is [num_blocks + 1, kv_heads, block_size, head_dim]; K has the same shape
but holds each (block, head) transposed, [head_dim, block_size]. A block is one contiguous piece
(12 KiB for SmolLM2 at block_size 16) and within it each head is contiguous, so reading one
sequence's blocks in order streams memory front to back (see paged_decode.cpp for why that matters
on CPU, and why K is transposed). The CUDA backends keep flash-attn's own layout (cuda.py).

Decode rows (one query each) go through SDPA a group at a time, a group being rows that read the
same number of blocks: each row's queries become [kv_heads, heads // kv_heads, head_dim], a short
"sequence" of queries per KV head, so grouped-query attention needs no repeated K/V. Prefill chunks go one
by one through SDPA. On CPU with fp32 queries the C++ kernels of cpu.py serve the same cache in place
where they are built; this backend is their fallback (no compiler, `--attention torch`, other dtypes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from conveyor.engine.attention.base import AttentionBatch, AttentionGeometry
from conveyor.engine.workspace import Workspace

# Decode rows per gather: the group's gathered K and V should still be in cache when SDPA reads
# them, and the group should be large enough that per-call overhead stays small.
_DECODE_GROUP = 16


@dataclass(slots=True)
class _Prefill:
    row: int  # first row in the flattened batch
    length: int
    start: int  # position of the first row
    blocks: torch.Tensor | None  # blocks covering 0..start+length-1; None: attend to the fresh k/v only

    @property
    def context(self) -> int:
        return self.start + self.length


@dataclass(slots=True)
class _DecodeGroup:
    rows: tuple[int, int]
    blocks: torch.Tensor  # [rows * width] block ids
    context: torch.Tensor  # [rows] context length of each row
    width: int  # blocks per row


@dataclass(slots=True)
class TorchMeta:
    where: tuple[torch.Tensor, torch.Tensor]  # (block, offset) of each new token
    decode: list[_DecodeGroup]
    prefills: list[_Prefill]
    # Masks, built by the first layer that needs one and reused by the others.
    masks: dict[tuple[int, int, int | None], torch.Tensor | None] = field(default_factory=dict)


class TorchAttention:
    name = "torch"
    supports_graphs = False

    def __init__(self, geometry: AttentionGeometry) -> None:
        self.g = geometry
        self.group = geometry.num_heads // geometry.num_kv_heads
        # Gathers land in reused buffers: a fresh multi-MB tensor per layer costs page faults that
        # take longer than the copy itself.
        self._workspace = [
            torch.empty(0, dtype=geometry.cache_dtype, device=geometry.device) for _ in range(2)
        ]
        self._output = Workspace(geometry.device, geometry.dtype)  # forward's result, reused on CPU

    def cache_shape(self) -> tuple[int, ...]:
        g = self.g
        return (g.num_blocks + 1, g.num_kv_heads, g.block_size, g.head_dim)

    def prepare(self, batch: AttentionBatch) -> TorchMeta:
        bs, device = self.g.block_size, self.g.device
        decode: list[_DecodeGroup] = []
        widths = [-(-ctx // bs) for ctx in batch.context_lens[: batch.num_decode]]
        lo = 0
        while lo < batch.num_decode:
            # A group holds rows of one width only (the runner sorts rows by width, so groups stay
            # large): a row's attention never depends on its neighbours and never reads padding.
            width, hi = widths[lo], lo + 1
            while hi < min(lo + _DECODE_GROUP, batch.num_decode) and widths[hi] == width:
                hi += 1
            ids = [block for table in batch.block_tables[lo:hi] for block in table[:width]]
            decode.append(
                _DecodeGroup(
                    rows=(lo, hi),
                    blocks=torch.tensor(ids, dtype=torch.long, device=device),
                    context=torch.tensor(batch.context_lens[lo:hi], dtype=torch.long, device=device),
                    width=width,
                )
            )
            lo = hi
        prefills: list[_Prefill] = []
        row = batch.num_decode
        for i in range(batch.num_decode, len(batch.query_lens)):
            length, ctx = batch.query_lens[i], batch.context_lens[i]
            start = ctx - length
            blocks = None
            if start > 0:
                blocks = torch.tensor(batch.block_tables[i][: -(-ctx // bs)], dtype=torch.long, device=device)
            prefills.append(_Prefill(row=row, length=length, start=start, blocks=blocks))
            row += length
        return TorchMeta(where=(batch.slots // bs, batch.slots % bs), decode=decode, prefills=prefills)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: TorchMeta,
        window: int | None,
    ) -> torch.Tensor:
        hd = self.g.head_dim
        # Write first: every query of this step must see its own token and the chunk before it.
        # Both seen as [blocks, block_size, kv, hd], token i's [kv, hd] goes to (block, offset).
        keys_by_token(k_cache).index_put_(meta.where, k.to(k_cache.dtype))
        v_cache.transpose(1, 2).index_put_(meta.where, v.to(v_cache.dtype))
        if meta.prefills and k_cache.dtype != q.dtype:  # SDPA on a fresh prompt reads k/v, not the cache:
            k, v = k.to(k_cache.dtype).to(q.dtype), v.to(v_cache.dtype).to(q.dtype)  # the cache's values
        # Reused by every layer on CPU: the o projection has read the last layer's output before
        # the next one writes it, and a fresh tensor per layer costs an allocation and page faults.
        out = self._output("out", q.shape)
        for i, grp in enumerate(meta.decode):
            self._decode(q, k_cache, v_cache, grp, self._mask(meta, 0, i, window), out)
        for i, chunk in enumerate(meta.prefills):
            self._prefill(q, k, v, k_cache, v_cache, chunk, self._mask(meta, 1, i, window), out)
        return out.view(q.shape[0], self.g.num_heads * hd)

    def _decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        grp: _DecodeGroup,
        mask: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        kv, hd = self.g.num_kv_heads, self.g.head_dim
        lo, hi = grp.rows
        n = hi - lo
        # Query head h reads KV head h // group: [rows, heads, hd] -> [rows, kv, group, hd].
        queries = q[lo:hi].view(n, kv, self.group, hd)
        # [kv, rows * width blocks, block_size, hd] -> [rows, kv, context, hd].
        keys = self._gather(k_cache, grp.blocks, 0).reshape(kv, n, -1, hd).transpose(0, 1)
        values = self._gather(v_cache, grp.blocks, 1).reshape(kv, n, -1, hd).transpose(0, 1)
        keys, values = keys.to(q.dtype), values.to(q.dtype)  # a bfloat16 cache's values, widened
        res = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=self.g.scale)
        out[lo:hi].view(n, kv, self.group, hd).copy_(res)

    def _prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        chunk: _Prefill,
        mask: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        kv, hd = self.g.num_kv_heads, self.g.head_dim
        rows = slice(chunk.row, chunk.row + chunk.length)
        if chunk.blocks is None:  # a fresh prompt: its keys are exactly this step's k/v
            keys, values = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
        else:  # [kv, context, hd]
            keys = self._gather(k_cache, chunk.blocks, 0).reshape(kv, -1, hd)[:, : chunk.context]
            values = self._gather(v_cache, chunk.blocks, 1).reshape(kv, -1, hd)[:, : chunk.context]
            keys, values = keys.to(q.dtype), values.to(q.dtype)  # a bfloat16 cache's values, widened
        res = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1).unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.g.scale,
            enable_gqa=True,
        )
        out[rows].copy_(res[0].transpose(0, 1))

    def _gather(self, cache: torch.Tensor, blocks: torch.Tensor, slot: int) -> torch.Tensor:
        """[kv_heads, len(blocks), block_size, head_dim]: the blocks of K (slot 0, a strided view)
        or V (slot 1, contiguous) head by head, in workspace `slot`."""
        by_head = cache.transpose(0, 1)
        shape = (by_head.shape[0], blocks.numel(), *by_head.shape[2:])
        size = shape[0] * shape[1] * shape[2] * shape[3]
        if self._workspace[slot].numel() < size:
            self._workspace[slot] = cache.new_empty(size + size // 4)  # headroom: contexts grow
        out = torch.index_select(by_head, 1, blocks, out=self._workspace[slot][:size].view(shape))
        if slot == 0:  # K holds [head_dim, block_size] per (block, head)
            return out.view(shape[0], shape[1], shape[3], shape[2]).transpose(2, 3)
        return out

    def _mask(self, meta: TorchMeta, kind: int, index: int, window: int | None) -> torch.Tensor | None:
        key = (kind, index, window)  # windows may differ between layers (Qwen2)
        if key not in meta.masks:
            if kind == 0:
                meta.masks[key] = self._decode_mask(meta.decode[index], window)
            else:
                meta.masks[key] = self._prefill_mask(meta.prefills[index], window)
        return meta.masks[key]

    def _decode_mask(self, grp: _DecodeGroup, window: int | None) -> torch.Tensor:
        """Additive [rows, 1, 1, context]: -inf past each row's context (and before its window)."""
        pos = torch.arange(grp.width * self.g.block_size, device=self.g.device)
        ctx = grp.context[:, None]
        valid = pos < ctx
        if window is not None:
            valid &= pos >= ctx - window
        mask = torch.zeros(valid.shape, dtype=self.g.dtype, device=self.g.device)
        return mask.masked_fill_(~valid, float("-inf"))[:, None, None, :]

    def _prefill_mask(self, chunk: _Prefill, window: int | None) -> torch.Tensor | None:
        """Boolean [length, context]; None when plain causal over the fresh k/v is exact."""
        if chunk.blocks is None and window is None:
            return None
        qpos = torch.arange(chunk.start, chunk.context, device=self.g.device)[:, None]
        kpos = torch.arange(chunk.context, device=self.g.device)[None, :]
        valid = kpos <= qpos
        if window is not None:
            valid &= kpos > qpos - window
        return valid


def keys_by_token(k_cache: torch.Tensor) -> torch.Tensor:
    """The K cache seen as [blocks, block_size, kv_heads, head_dim] (a strided view): each
    (block, head) is stored [head_dim, block_size]."""
    blocks, kv, bs, hd = k_cache.shape
    return k_cache.view(blocks, kv, hd, bs).permute(0, 3, 1, 2)
