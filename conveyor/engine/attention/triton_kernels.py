"""Paged attention in Triton: a varlen prefill kernel and a split-K decode kernel.

Both read K/V in place through the block tables, on the CUDA backends' cache layout
[num_blocks + 1, block_size, kv_heads, head_dim] (flash-attn's): no gather, any block size.
Grouped-query attention is packed: one program serves every query head of one KV head, so each K/V
tile is loaded once for the whole group. Scores are fp32 with an online softmax in base 2.

- Prefill: a program takes a tile of BLOCK_Q query positions of one chunk (x the group's heads =
  BLOCK_M rows) and walks the keys from the window's start to the tile's causal end. Causal is
  aligned bottom-right: a chunk's rows also see the cached context before them.
- Decode: one query row per sequence. Splits only where the rows alone leave the device idle: the
  grid's splits per row (decode_splits) fill one program per SM at most, so a small batch cuts each
  context into splits (at least SPLIT_MIN keys each, at most MAX_SPLITS) run as separate programs
  and merged by a reduce kernel, while a batch whose rows x KV heads already cover the SMs runs one
  program per row and KV head, with no partials and no reduce. A row uses the grid's splits its
  own context needs and no more: a split past them stores nothing, and a row of one split stores
  its result directly. A row's splits thus follow its own context and the batch's size (as
  cuBLAS's kernel choice does), never its neighbours' contents; the grid follows the batch size and
  the block table's width only, so a captured CUDA graph replays for any context that fits.

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
def _row_splits(ctx, window, SPLIT_MIN: tl.constexpr, GRID_SPLITS: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """A decode row's first key and its splits: as many as its keys need, up to the grid's."""
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(ctx - window, 0)
    return first, tl.minimum(tl.cdiv(ctx - first, SPLIT_MIN), GRID_SPLITS)


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, out_ptr, part_ptr, ml_ptr, table_ptr, table_stride, ctx_ptr,
                   scale_log2, window,
                   NUM_HEADS: tl.constexpr, NUM_KV: tl.constexpr, GROUP: tl.constexpr,
                   HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_MIN: tl.constexpr,
                   GRID_SPLITS: tl.constexpr, HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    seq, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ctx = tl.load(ctx_ptr + seq)
    first, splits = _row_splits(ctx, window, SPLIT_MIN, GRID_SPLITS, HAS_WINDOW)
    size = tl.cdiv(tl.cdiv(ctx - first, splits), BLOCK_N) * BLOCK_N
    lo = first + split * size  # past the row's own splits: lo >= ctx, no keys
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
    # Which heads store: all of the group or none, the condition folded into the heads' bound
    # (Triton's interpreter cannot mask a block with a scalar). A row of one split normalises and
    # stores its result here, for the reduce kernel to skip.
    whole = g < tl.where((splits == 1) & (split == 0), GROUP, 0)
    done = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + q_off, done.to(out_ptr.dtype.element_ty), mask=whole[:, None] & d_ok[None, :])
    if GRID_SPLITS > 1:  # partials [seq, head, split, ...] of the row's own splits only
        mine = g < tl.where((splits > 1) & (split < splits), GROUP, 0)
        part = (seq.to(tl.int64) * NUM_HEADS + head) * GRID_SPLITS + split
        tl.store(part_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=mine[:, None] & d_ok[None, :])
        tl.store(ml_ptr + part * 2, m_i, mask=mine)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=mine)


@triton.jit
def _reduce_kernel(out_ptr, part_ptr, ml_ptr, ctx_ptr, window, NUM_HEADS: tl.constexpr,
                   HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, SPLIT_MIN: tl.constexpr,
                   GRID_SPLITS: tl.constexpr, SPLIT_PAD: tl.constexpr, HAS_WINDOW: tl.constexpr):  # fmt: skip
    seq, head = tl.program_id(0), tl.program_id(1)
    _, splits = _row_splits(tl.load(ctx_ptr + seq), window, SPLIT_MIN, GRID_SPLITS, HAS_WINDOW)
    s = tl.arange(0, SPLIT_PAD)
    s_ok = s < splits  # the row's own splits: the others wrote nothing
    many = splits > 1  # else the decode kernel stored the row's result itself: nothing to merge
    part = (seq.to(tl.int64) * NUM_HEADS + head) * GRID_SPLITS + s
    m = tl.load(ml_ptr + part * 2, mask=s_ok, other=float("-inf"))
    l_s = tl.load(ml_ptr + part * 2 + 1, mask=s_ok, other=0.0)
    top = tl.where(many, tl.max(m, 0), 0.0)  # finite: the first split always holds the query's own key
    weight = tl.math.exp2(m - top)
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD_DIM
    acc = tl.load(part_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                  other=0.0)
    merged = tl.sum(acc * weight[:, None], 0) / tl.where(many, tl.sum(l_s * weight, 0), 1.0)
    out_off = (seq.to(tl.int64) * NUM_HEADS + head) * HEAD_DIM + d
    tl.store(out_ptr + out_off, merged.to(out_ptr.dtype.element_ty), mask=d < tl.where(many, HEAD_DIM, 0))


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


def decode_splits(programs: int, sms: int, width: int, block_size: int, split_min: int = SPLIT_MIN) -> int:
    """The grid's splits per row, for `programs` = rows x KV heads: as many as keep the grid within
    one program per SM (1 once the rows fill the SMs), as the widest context (a block table `width`
    blocks wide) needs, at most MAX_SPLITS."""
    fill = max(1, sms // programs)
    return min(MAX_SPLITS, fill, triton.cdiv(width * block_size, split_min))


def sm_count(device: torch.device) -> int:
    """The device's SMs; off CUDA (Triton's interpreter, for tests) an H100's 132."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def partials(seqs: int, heads: int, splits: int, head_dim: int,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The split programs' fp32 partial outputs and their (max, sum) pairs; only a row's own
    splits write theirs."""
    part = torch.empty((seqs, heads, splits, head_dim), dtype=torch.float32, device=device)
    return part, torch.empty((seqs, heads, splits, 2), dtype=torch.float32, device=device)


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
           block_table: torch.Tensor, context_lens: torch.Tensor, scale: float, window: int | None,
           sms: int, split_min: int = SPLIT_MIN) -> None:  # fmt: skip
    """One query row per sequence: q/out [seqs, heads, head_dim]; sms: the device's SM count
    (sm_count), which sets how many splits fill it."""
    seqs, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    splits = decode_splits(seqs * kv_heads, sms, block_table.shape[1], block_size, split_min)
    part = ml = out  # unused with one split
    if splits > 1:
        part, ml = partials(seqs, heads, splits, head_dim, q.device)
    _decode_kernel[(seqs, kv_heads, splits)](
        q, k_cache, v_cache, out, part, ml, block_table, block_table.stride(0), context_lens,
        scale * LOG2E, window or 0,
        NUM_HEADS=heads, NUM_KV=kv_heads, GROUP=group, HEAD_DIM=head_dim, HEAD_PAD=_pad(head_dim),
        BLOCK_SIZE=block_size, BLOCK_G=_pad(group), BLOCK_N=BLOCK_N, SPLIT_MIN=split_min,
        GRID_SPLITS=splits, HAS_WINDOW=window is not None, PRECISION=_precision(q.dtype),
        num_warps=4, num_stages=2,
    )  # fmt: skip
    if splits > 1:
        _reduce_kernel[(seqs, heads)](
            out, part, ml, context_lens, window or 0, NUM_HEADS=heads, HEAD_DIM=head_dim,
            HEAD_PAD=_pad(head_dim), SPLIT_MIN=split_min, GRID_SPLITS=splits,
            SPLIT_PAD=triton.next_power_of_2(splits), HAS_WINDOW=window is not None, num_warps=1,
        )  # fmt: skip
