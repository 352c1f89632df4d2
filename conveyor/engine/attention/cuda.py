"""What the CUDA attention backends share: the step's metadata on the device, the KV write, and
CUDA graphs for pure-decode steps.

Both CUDA backends (flash.py: flash-attn's kernels; triton_paged.py: this project's Triton kernels)
keep flash-attn's cache layout per layer, [num_blocks + 1, block_size, kv_heads, head_dim], so
either can serve the same cache and copy-on-write is one index_copy.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from conveyor.engine.attention.base import AttentionBatch, AttentionGeometry
from conveyor.engine.block_tables import BlockTables
from conveyor.engine.staging import to_device

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class CudaMeta:
    slots: torch.Tensor  # [T] long: cache slot of each new token
    context_lens: torch.Tensor  # [N] int32
    block_table: torch.Tensor  # [N, width] int32, decode rows first
    num_decode: int  # the first num_decode sequences have one query row each
    prefill: Any = None  # the backend's own plan for the prefill chunks; None in a pure-decode step

    @property
    def decode_only(self) -> bool:
        return self.num_decode == self.context_lens.shape[0]


def cuda_layout(g: AttentionGeometry) -> tuple[int, ...]:
    return (g.num_blocks + 1, g.block_size, g.num_kv_heads, g.head_dim)


def prepare_meta(batch: AttentionBatch, g: AttentionGeometry, tables: BlockTables) -> CudaMeta:
    """The block tables cut to the blocks the widest sequence reads, gathered on the device from
    the backend's persistent table (block_tables.py: only what changed is copied, without a host
    sync; padded with block 0, never read)."""
    width = max(-(-ctx // g.block_size) for ctx in batch.context_lens)
    return CudaMeta(
        slots=batch.slots,
        context_lens=to_device(batch.context_lens, torch.int32, g.device),
        block_table=tables.gather(tables.rows(batch.block_tables), width),
        num_decode=batch.num_decode,
    )


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor) -> None:  # fmt: skip
    kv, hd = k.shape[1], k.shape[2]
    k_cache.view(-1, kv, hd).index_copy_(0, slots, k)
    v_cache.view(-1, kv, hd).index_copy_(0, slots, v)


def cumulative(lengths: list[int], device: torch.device) -> torch.Tensor:
    """[len + 1] int32 prefix sums: where each chunk's rows start."""
    return to_device([0, *itertools.accumulate(lengths)], torch.int32, device)


Forward = Callable[[torch.Tensor, torch.Tensor, CudaMeta], torch.Tensor]


def graph_sizes(max_batch: int, wanted: tuple[int, ...] | None) -> list[int]:
    """Batch sizes to capture: `wanted` (TGI's --cuda-graphs) cut to max_batch, or by default
    1, 2, 4, 8, then every 16 up to max_batch."""
    if wanted is None:
        wanted = (1, 2, 4, 8, *range(16, max_batch + 1, 16), max_batch)
    return sorted({s for s in wanted if 0 < s <= max_batch})


def capture_decode_graphs(forward: Forward, geometry: AttentionGeometry, sizes: list[int],
                          max_context: int) -> DecodeGraphs | None:  # fmt: skip
    """The decode graphs, or None when capturing them fails: the worker then serves every step
    eager rather than die at start, and says why once."""
    try:
        return DecodeGraphs(forward, geometry, sizes, max_context)
    except Exception as exc:  # noqa: BLE001 - whatever broke the capture, eager steps still run
        logger.warning(
            "CUDA graph capture failed, so decode steps run eager: every kernel of a step is launched "
            "from Python, which costs most at small batches, where launches dominate a step "
            "(%s: %s)", type(exc).__name__, exc,
        )  # fmt: skip
    if geometry.device.type == "cuda":
        # Give back the half-captured graphs' memory pool. A sticky CUDA error (one that broke the
        # context, not just the capture) raises here: nothing could run then, eager included.
        torch.cuda.synchronize(geometry.device)
        torch.cuda.empty_cache()
    return None


class DecodeGraphs:
    """The model's forward captured for pure-decode batches of a few sizes.

    A batch of n rows replays the smallest captured size >= n. Padding rows write to and read from
    the cache's scratch block only, so they never touch a sequence's KV.
    """

    def __init__(self, forward: Forward, geometry: AttentionGeometry, sizes: list[int],
                 max_context: int) -> None:  # fmt: skip
        g = geometry
        device = g.device
        self.sizes = sizes
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
            meta = CudaMeta(
                slots=self.slots[:size],
                context_lens=self.context_lens[:size],
                block_table=self.block_table[:size],
                num_decode=size,
            )
            forward(self.ids[:size], self.positions[:size], meta)  # warm-up: kernel choice, workspaces
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = forward(self.ids[:size], self.positions[:size], meta)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
        torch.cuda.synchronize(device)

    def run(self, ids: torch.Tensor, positions: torch.Tensor, meta: CudaMeta) -> torch.Tensor | None:
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
