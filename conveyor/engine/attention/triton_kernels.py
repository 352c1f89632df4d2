"""Paged attention in Triton: a varlen prefill kernel and a split-K decode kernel.

Both read K/V in place through the block tables, on the CUDA backends' cache layout
[num_blocks + 1, block_size, kv_heads, head_dim] (flash-attn's): no gather, any block size.
Grouped-query attention is packed: one program serves every query head of one KV head, so each K/V
tile is loaded once for the whole group. Scores are fp32 with an online softmax in base 2.

- Prefill: a program takes a tile of BLOCK_Q query positions of one chunk (x the group's heads =
  BLOCK_M rows) and walks the keys from the window's start to the tile's causal end. Causal is
  aligned bottom-right: a chunk's rows also see the cached context before them.
- Decode: one query row per sequence; the context is cut into splits (at most MAX_SPLITS, at
  least SPLIT_MIN keys each) that run as separate programs, then a reduce kernel merges them. A
  sequence's splits depend on its own context length only, so its output does not depend on the
  rest of the batch; the grid depends on the block table's width only, so a captured CUDA graph
  replays for any context that fits.

Runs on CUDA, and on CPU under Triton's interpreter (TRITON_INTERPRET=1, set before triton is
imported), which the tests use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
SPLIT_MIN = 256  # keys per decode split, at least
MAX_SPLITS = 16
BLOCK_N = 64  # keys per tile
PREFILL_BLOCK_M = 64  # rows per prefill program: query positions x heads of one KV group


@dataclass(frozen=True, slots=True)
class PrefillTiles:
    """Which chunk, and which of its query positions, each prefill program takes."""

    chunk: torch.Tensor  # [tiles] int32
    first_query: torch.Tensor  # [tiles] int32, index within the chunk


def queries_per_tile(group: int) -> int:
    return max(1, PREFILL_BLOCK_M // group)


def plan_prefill_tiles(query_lens: list[int], group: int, device: torch.device) -> PrefillTiles:
    per_tile = queries_per_tile(group)
    chunk: list[int] = []
    first: list[int] = []
    for i, n in enumerate(query_lens):
        for q0 in range(0, n, per_tile):
            chunk.append(i)
            first.append(q0)
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    return PrefillTiles(as_tensor(chunk), as_tensor(first))


def _pad(n: int) -> int:
    return max(16, triton.next_power_of_2(n))  # tl.dot wants every dimension >= 16


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # fp32 stays exact; bf16/fp16 ignore it


@triton.jit
def _attend_tile(q, k_ptr, v_ptr, table_row, n, n_ok, see, m_i, l_i, acc, d, d_ok, kvh, scale_log2,
                 BLOCK_SIZE: tl.constexpr, NUM_KV: tl.constexpr, HEAD_DIM: tl.constexpr,
                 PRECISION: tl.constexpr):  # fmt: skip
    """One tile of keys at positions n: online-softmax update of (m_i, l_i, acc)."""
    block = tl.load(table_row + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
    offset = ((block * BLOCK_SIZE + n % BLOCK_SIZE) * NUM_KV + kvh) * HEAD_DIM
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + offset[:, None] + d[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    s = tl.where(see, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that sees nothing yet stays 0
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    v = tl.load(v_ptr + offset[:, None] + d[None, :], mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, out_ptr, table_ptr, table_stride, q_start_ptr, ctx_ptr,
                    tile_chunk_ptr, tile_q0_ptr, scale_log2, window,
                    NUM_HEADS: tl.constexpr, NUM_KV: tl.constexpr, GROUP: tl.constexpr,
                    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                    HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    tile, kvh = tl.program_id(0), tl.program_id(1)
    chunk = tl.load(tile_chunk_ptr + tile)
    q0 = tl.load(tile_q0_ptr + tile)
    row0 = tl.load(q_start_ptr + chunk)
    length = tl.load(q_start_ptr + chunk + 1) - row0
    ctx = tl.load(ctx_ptr + chunk)
    start = ctx - length  # position of the chunk's first query

    r = tl.arange(0, BLOCK_M)
    query = q0 + r // GROUP
    head = kvh * GROUP + r % GROUP
    row_ok = (r < BLOCK_Q * GROUP) & (query < length)
    qpos = start + query
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD_DIM
    q_off = (row0 + query).to(tl.int64)[:, None] * (NUM_HEADS * HEAD_DIM) + head[:, None] * HEAD_DIM
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + q_off + d[None, :], mask=q_mask, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    end = tl.minimum(start + q0 + BLOCK_Q, ctx)  # the tile's last query sees keys up to end - 1
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(start + q0 - window + 1, 0)
    table_row = table_ptr + chunk.to(tl.int64) * table_stride
    for n0 in range(lo, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        see = (n[None, :] <= qpos[:, None]) & n_ok[None, :]
        if HAS_WINDOW:
            see = see & (n[None, :] > qpos[:, None] - window)
        m_i, l_i, acc = _attend_tile(q, k_ptr, v_ptr, table_row, n, n_ok, see, m_i, l_i, acc, d, d_ok,
                                     kvh, scale_log2, BLOCK_SIZE, NUM_KV, HEAD_DIM, PRECISION)
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + q_off + d[None, :], acc.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, out_ptr, part_ptr, ml_ptr, table_ptr, table_stride, ctx_ptr,
                   scale_log2, window,
                   NUM_HEADS: tl.constexpr, NUM_KV: tl.constexpr, GROUP: tl.constexpr,
                   HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_MIN: tl.constexpr,
                   MAX_SPLITS: tl.constexpr, GRID_SPLITS: tl.constexpr, HAS_WINDOW: tl.constexpr,
                   PRECISION: tl.constexpr):  # fmt: skip
    seq, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ctx = tl.load(ctx_ptr + seq)
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(ctx - window, 0)
    span = ctx - first
    splits = tl.minimum(tl.cdiv(span, SPLIT_MIN), MAX_SPLITS)
    size = tl.cdiv(tl.cdiv(span, splits), BLOCK_N) * BLOCK_N
    lo = first + split * size
    hi = tl.minimum(lo + size, ctx)

    g = tl.arange(0, BLOCK_G)
    head = kvh * GROUP + g
    g_ok = g < GROUP
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD_DIM
    q_off = seq.to(tl.int64) * (NUM_HEADS * HEAD_DIM) + head[:, None] * HEAD_DIM + d[None, :]
    q = tl.load(q_ptr + q_off, mask=g_ok[:, None] & d_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_PAD], tl.float32)
    table_row = table_ptr + seq.to(tl.int64) * table_stride
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        see = g_ok[:, None] & n_ok[None, :]
        m_i, l_i, acc = _attend_tile(q, k_ptr, v_ptr, table_row, n, n_ok, see, m_i, l_i, acc, d, d_ok,
                                     kvh, scale_log2, BLOCK_SIZE, NUM_KV, HEAD_DIM, PRECISION)
    mask = g_ok[:, None] & d_ok[None, :]
    if GRID_SPLITS == 1:  # one split: normalise and store, no reduce kernel
        acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + q_off, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # partials [seq, head, split, ...]: an empty split stores m = -inf, l = 0
        part = (seq.to(tl.int64) * NUM_HEADS + head) * GRID_SPLITS + split
        tl.store(part_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=mask)
        tl.store(ml_ptr + part * 2, m_i, mask=g_ok)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=g_ok)


@triton.jit
def _reduce_kernel(out_ptr, part_ptr, ml_ptr, NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                   HEAD_PAD: tl.constexpr, GRID_SPLITS: tl.constexpr, SPLIT_PAD: tl.constexpr):  # fmt: skip
    seq, head = tl.program_id(0), tl.program_id(1)
    s = tl.arange(0, SPLIT_PAD)
    s_ok = s < GRID_SPLITS
    part = (seq.to(tl.int64) * NUM_HEADS + head) * GRID_SPLITS + s
    m = tl.load(ml_ptr + part * 2, mask=s_ok, other=float("-inf"))
    l_s = tl.load(ml_ptr + part * 2 + 1, mask=s_ok, other=0.0)
    top = tl.max(m, 0)  # finite: the first split always holds the query's own key
    weight = tl.math.exp2(m - top)
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD_DIM
    acc = tl.load(part_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                  other=0.0)
    merged = tl.sum(acc * weight[:, None], 0) / tl.sum(l_s * weight, 0)
    out_off = (seq.to(tl.int64) * NUM_HEADS + head) * HEAD_DIM + d
    tl.store(out_ptr + out_off, merged.to(out_ptr.dtype.element_ty), mask=d_ok)


def prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
            block_table: torch.Tensor, q_start: torch.Tensor, context_lens: torch.Tensor,
            tiles: PrefillTiles, scale: float, window: int | None) -> None:  # fmt: skip
    """Prefill chunks: q/out [rows, heads, head_dim], chunk i's rows q_start[i]..q_start[i+1];
    block_table [chunks, width] int32, context_lens [chunks] int32 (start + length)."""
    _, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    grid = (tiles.chunk.numel(), kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, block_table, block_table.stride(0), q_start, context_lens,
        tiles.chunk, tiles.first_query, scale * LOG2E, window or 0,
        NUM_HEADS=heads, NUM_KV=kv_heads, GROUP=group, HEAD_DIM=head_dim, HEAD_PAD=_pad(head_dim),
        BLOCK_SIZE=block_size, BLOCK_M=_pad(queries_per_tile(group) * group),
        BLOCK_Q=queries_per_tile(group), BLOCK_N=BLOCK_N, HAS_WINDOW=window is not None,
        PRECISION=_precision(q.dtype), num_warps=4, num_stages=2,
    )  # fmt: skip


def decode_splits(width: int, block_size: int, split_min: int = SPLIT_MIN) -> int:
    """Split programs per sequence for a block table `width` blocks wide."""
    return min(MAX_SPLITS, triton.cdiv(width * block_size, split_min))


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
           block_table: torch.Tensor, context_lens: torch.Tensor, scale: float, window: int | None,
           split_min: int = SPLIT_MIN) -> None:  # fmt: skip
    """One query row per sequence: q/out [seqs, heads, head_dim]."""
    seqs, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    splits = decode_splits(block_table.shape[1], block_size, split_min)
    part = ml = out  # unused with one split
    if splits > 1:
        part = torch.empty((seqs, heads, splits, head_dim), dtype=torch.float32, device=q.device)
        ml = torch.empty((seqs, heads, splits, 2), dtype=torch.float32, device=q.device)
    _decode_kernel[(seqs, kv_heads, splits)](
        q, k_cache, v_cache, out, part, ml, block_table, block_table.stride(0), context_lens,
        scale * LOG2E, window or 0,
        NUM_HEADS=heads, NUM_KV=kv_heads, GROUP=group, HEAD_DIM=head_dim, HEAD_PAD=_pad(head_dim),
        BLOCK_SIZE=block_size, BLOCK_G=_pad(group), BLOCK_N=BLOCK_N, SPLIT_MIN=split_min,
        MAX_SPLITS=MAX_SPLITS, GRID_SPLITS=splits, HAS_WINDOW=window is not None,
        PRECISION=_precision(q.dtype), num_warps=4, num_stages=2,
    )  # fmt: skip
    if splits > 1:
        _reduce_kernel[(seqs, heads)](
            out, part, ml, NUM_HEADS=heads, HEAD_DIM=head_dim, HEAD_PAD=_pad(head_dim),
            GRID_SPLITS=splits, SPLIT_PAD=triton.next_power_of_2(splits), num_warps=1,
        )  # fmt: skip
