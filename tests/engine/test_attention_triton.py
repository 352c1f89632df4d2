"""The Triton paged-attention kernels against plain torch attention, under Triton's CPU interpreter
(TRITON_INTERPRET=1, set by tests/conftest.py): block sizes 16 and 256, GQA groups 1/3/8, ragged
contexts, blocks scattered through the cache, sliding windows, decode contexts cut into many splits."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
from conveyor.engine.attention import triton_kernels  # noqa: E402


def _cache(contexts: list[int], block_size: int, kv: int, hd: int, seed: int):
    """A cache holding random K/V for each sequence in shuffled blocks; the dense K/V per sequence."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-c // block_size) for c in contexts]
    blocks = list(range(sum(need) + 3))
    random.Random(seed).shuffle(blocks)
    k_cache = torch.randn(len(blocks), block_size, kv, hd, generator=gen)
    v_cache = torch.randn(len(blocks), block_size, kv, hd, generator=gen)
    tables, dense = [], []
    for c, n in zip(contexts, need, strict=True):
        table = [blocks.pop() for _ in range(n)]
        tables.append(table)
        dense.append((k_cache[table].flatten(0, 1)[:c], v_cache[table].flatten(0, 1)[:c]))
    width = max(need)
    table_t = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return k_cache, v_cache, table_t, dense


def _reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int | None):
    """q [n, heads, hd] at the last n positions of keys/values [ctx, kv, hd]."""
    n, ctx = q.shape[0], keys.shape[0]
    qpos = torch.arange(ctx - n, ctx)[:, None]
    kpos = torch.arange(ctx)[None, :]
    see = kpos <= qpos
    if window is not None:
        see &= qpos - kpos < window
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), attn_mask=see,
        scale=q.shape[-1] ** -0.5, enable_gqa=True,
    )  # fmt: skip
    return out.transpose(0, 1)


CASES = [  # block_size, heads, kv_heads, head_dim, window
    (16, 4, 4, 16, None),
    (16, 6, 2, 32, None),
    (256, 8, 1, 16, None),
    (16, 6, 2, 16, 20),
    (256, 4, 4, 32, 70),
]


@pytest.mark.parametrize(("block_size", "heads", "kv", "hd", "window"), CASES)
def test_decode_matches_torch(block_size: int, heads: int, kv: int, hd: int, window: int | None) -> None:
    contexts = [1, 17, 300, 64, 1100, 129, 5]
    k_cache, v_cache, table, dense = _cache(contexts, block_size, kv, hd, seed=block_size + heads)
    q = torch.randn(len(contexts), heads, hd, generator=torch.Generator().manual_seed(1))
    out = torch.full_like(q, float("nan"))
    ctx = torch.tensor(contexts, dtype=torch.int32)
    # split_min 16: each context is planned as up to 16 splits, rounded up to whole 64-key tiles:
    # 1,100 keys run as 9 splits of 128 (two tiles each, the last cut short), 300 as 5 of 64, and
    # every sequence leaves some of the grid's 16 splits empty.
    triton_kernels.decode(q, k_cache, v_cache, out, table, ctx, hd**-0.5, window, split_min=16)
    for i, (keys, values) in enumerate(dense):
        torch.testing.assert_close(out[i : i + 1], _reference(q[i : i + 1], keys, values, window))


def test_decode_with_one_split_needs_no_reduce() -> None:
    contexts = [3, 40, 11]
    k_cache, v_cache, table, dense = _cache(contexts, 16, 2, 16, seed=3)
    assert triton_kernels.decode_splits(table.shape[1], 16) == 1
    q = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(2))
    out = torch.empty_like(q)
    ctx = torch.tensor(contexts, dtype=torch.int32)
    triton_kernels.decode(q, k_cache, v_cache, out, table, ctx, 0.25, None)
    for i, (keys, values) in enumerate(dense):
        torch.testing.assert_close(out[i : i + 1], _reference(q[i : i + 1], keys, values, None))


@pytest.mark.parametrize(("block_size", "heads", "kv", "hd", "window"), CASES)
def test_prefill_matches_torch(block_size: int, heads: int, kv: int, hd: int, window: int | None) -> None:
    # (chunk length, context): fresh prompts, chunks after a cached prefix, one of a single row.
    chunks = [(37, 37), (20, 150), (1, 9), (70, 300), (5, 5)]
    contexts = [c for _, c in chunks]
    k_cache, v_cache, table, dense = _cache(contexts, block_size, kv, hd, seed=7 * heads + kv)
    lens = [n for n, _ in chunks]
    q = torch.randn(sum(lens), heads, hd, generator=torch.Generator().manual_seed(5))
    out = torch.full_like(q, float("nan"))
    starts = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    tiles = triton_kernels.plan_prefill_tiles(lens, heads // kv, q.device)
    triton_kernels.prefill(q, k_cache, v_cache, out, table, starts, torch.tensor(contexts, dtype=torch.int32),
                           tiles, hd**-0.5, window)  # fmt: skip
    for i, (keys, values) in enumerate(dense):
        rows = slice(int(starts[i]), int(starts[i + 1]))
        torch.testing.assert_close(out[rows], _reference(q[rows], keys, values, window))


def test_prefill_tiles_cover_each_chunk_once() -> None:
    tiles = triton_kernels.plan_prefill_tiles([1, 64, 65, 0, 130], group=3, device=torch.device("cpu"))
    per = triton_kernels.queries_per_tile(3)
    pairs = list(zip(tiles.chunk.tolist(), tiles.first_query.tolist(), strict=True))
    for chunk, n in enumerate([1, 64, 65, 0, 130]):
        assert [q0 for c, q0 in pairs if c == chunk] == list(range(0, n, per))
