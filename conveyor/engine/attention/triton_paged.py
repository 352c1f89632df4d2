"""Attention on CUDA through this project's Triton kernels (triton_kernels.py): the default on
CUDA, since Triton ships inside every CUDA build of torch and flash-attn has no binary wheel.

Decode rows go through the split-K decode kernel, all prefill chunks of a step through one call of
the varlen prefill kernel. Pure-decode steps are captured as CUDA graphs (cuda.DecodeGraphs).
Triton is imported when this backend is built; on CPU it runs only under Triton's interpreter
(TRITON_INTERPRET=1), which is how the tests run it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from conveyor.engine.attention.base import AttentionBatch, AttentionGeometry
from conveyor.engine.attention.cuda import CudaMeta, cuda_layout, cumulative, prepare_meta, write_kv
from conveyor.engine.block_tables import BlockTables

if TYPE_CHECKING:
    from conveyor.engine.attention.triton_kernels import PrefillTiles


@dataclass(frozen=True, slots=True)
class _PrefillPlan:
    q_start: torch.Tensor  # [chunks + 1] int32, relative to the first prefill row
    tiles: PrefillTiles


def triton_unavailable_reason(geometry: AttentionGeometry) -> str | None:
    """Why the Triton kernels cannot serve this geometry, or None when they can."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (it comes with torch's CUDA builds)"
    if geometry.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton kernels need a CUDA device (on CPU only under TRITON_INTERPRET=1, for tests)"
    return None


class TritonAttention:
    name = "triton"
    supports_graphs = True

    def __init__(
        self, geometry: AttentionGeometry, split_min: int | None = None, sms: int | None = None
    ) -> None:
        import conveyor.engine.attention.triton_kernels as triton_kernels

        self.g = geometry
        self.tables = BlockTables(pad=0, device=geometry.device)
        self.kernels = triton_kernels
        self.group = geometry.num_heads // geometry.num_kv_heads
        self.split_min = split_min or triton_kernels.SPLIT_MIN  # tests lower it to get many splits
        self.sms = sms or triton_kernels.sm_count(geometry.device)  # how many splits fill the device

    def cache_shape(self) -> tuple[int, ...]:
        return cuda_layout(self.g)

    def prepare(self, batch: AttentionBatch) -> CudaMeta:
        meta = prepare_meta(batch, self.g, self.tables)
        if not meta.decode_only:
            lens = batch.query_lens[batch.num_decode :]
            meta.prefill = _PrefillPlan(
                q_start=cumulative(lens, self.g.device),
                tiles=self.kernels.plan_prefill_tiles(lens, self.group, self.g.device),
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
        q = q.contiguous()
        out = torch.empty_like(q)
        n = meta.num_decode
        if n:
            self.kernels.decode(q[:n], k_cache, v_cache, out[:n], meta.block_table[:n],
                                meta.context_lens[:n], g.scale, window, self.sms, self.split_min)  # fmt: skip
        if meta.prefill is not None:
            p: _PrefillPlan = meta.prefill
            self.kernels.prefill(q[n:], k_cache, v_cache, out[n:], meta.block_table[n:], p.q_start,
                                 meta.context_lens[n:], p.tiles, g.scale, window)  # fmt: skip
        return out.view(q.shape[0], g.num_heads * g.head_dim)
