"""Attention on CUDA through flash-attn's paged-KV kernels, when flash-attn is installed.

flash_attn is imported when this backend is built, never when the module is imported, so installs
without it never need it. flash-attn has no binary wheel on PyPI; the Triton backend
(triton_paged.py) is the default on CUDA when it is missing. Tested only where flash-attn and a GPU
are present (tests/engine/test_attention_cuda.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conveyor.engine.attention.base import AttentionBatch, AttentionGeometry
from conveyor.engine.attention.cuda import CudaMeta, cuda_layout, cumulative, prepare_meta, write_kv
from conveyor.engine.block_tables import BlockTables


@dataclass(frozen=True, slots=True)
class _Varlen:
    cu_q: torch.Tensor  # [N + 1] int32
    cu_k: torch.Tensor
    max_q: int
    max_k: int


class FlashAttention:
    name = "flash-attn"
    supports_graphs = True

    def __init__(self, geometry: AttentionGeometry) -> None:
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        self.g = geometry
        self.tables = BlockTables(pad=0, device=geometry.device)
        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache

    def cache_shape(self) -> tuple[int, ...]:
        return cuda_layout(self.g)

    def prepare(self, batch: AttentionBatch) -> CudaMeta:
        meta = prepare_meta(batch, self.g, self.tables)
        if not meta.decode_only:  # flash-attn's varlen call takes the decode rows as chunks of one
            device = self.g.device
            meta.prefill = _Varlen(
                cumulative(batch.query_lens, device),
                cumulative(batch.context_lens, device),
                max(batch.query_lens),
                max(batch.context_lens),
            )
        return meta

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: CudaMeta,
        window: int | None,
    ) -> torch.Tensor:
        write_kv(k, v, k_cache, v_cache, meta.slots)
        return self.attend(q, k_cache, v_cache, meta, window)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: CudaMeta,
               window: int | None) -> torch.Tensor:  # fmt: skip
        """Attention over a cache that already holds this step's K/V (the model's fused RoPE + KV
        write, or forward above)."""
        g = self.g
        # flash-attn's window counts keys left of the query: q_pos - k_pos <= window - 1.
        window_size = (window - 1, 0) if window is not None else (-1, -1)
        q = q.contiguous()
        if meta.prefill is None:
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
            p: _Varlen = meta.prefill
            # Causal is aligned bottom-right: a chunk's rows see the cached context before them.
            out = self._varlen(
                q,
                k_cache,
                v_cache,
                cu_seqlens_q=p.cu_q,
                cu_seqlens_k=p.cu_k,
                max_seqlen_q=p.max_q,
                max_seqlen_k=p.max_k,
                softmax_scale=g.scale,
                causal=True,
                window_size=window_size,
                block_table=meta.block_table,
            )
        return out.reshape(q.shape[0], g.num_heads * g.head_dim)
