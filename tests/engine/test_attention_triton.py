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


def _own_splits(ctx: int, window: int | None, split_min: int, grid: int) -> int:
    return min(-(-min(ctx, window or ctx) // split_min), grid)


@pytest.mark.parametrize("fill", [16, 3])
@pytest.mark.parametrize(("block_size", "heads", "kv", "hd", "window"), CASES)
def test_decode_matches_torch(
    block_size: int, heads: int, kv: int, hd: int, window: int | None, fill: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    contexts = [1, 17, 300, 64, 1100, 129, 5]
    k_cache, v_cache, table, dense = _cache(contexts, block_size, kv, hd, seed=block_size + heads)
    q = torch.randn(len(contexts), heads, hd, generator=torch.Generator().manual_seed(1))
    out = torch.full_like(q, float("nan"))
    ctx = torch.tensor(contexts, dtype=torch.int32)
    written = _nan_partials(monkeypatch)
    # split_min 16 and SMs for `fill` splits per row: with 16 each context is planned as up to 16
    # splits, rounded up to whole 64-key tiles: 1,100 keys run as 9 splits of 128 (two tiles each,
    # the last cut short), 300 as 5 of 64, and every sequence leaves some of the grid's 16 splits
    # empty; with 3 the longer contexts are capped at 3 splits.
    sms = fill * len(contexts) * kv
    assert triton_kernels.decode_splits(len(contexts) * kv, sms, table.shape[1], block_size, 16) == fill
    triton_kernels.decode(q, k_cache, v_cache, out, table, ctx, hd**-0.5, window, sms, split_min=16)
    for i, (keys, values) in enumerate(dense):
        torch.testing.assert_close(out[i : i + 1], _reference(q[i : i + 1], keys, values, window))
    [(part, ml)] = written
    for i, c in enumerate(contexts):  # partials of a row's own splits only, none for a one-split row
        own = _own_splits(c, window, 16, fill)
        stored = own if own > 1 else 0
        assert not part[i, :, :stored].isnan().any() and part[i, :, stored:].isnan().all()
        assert not ml[i, :, :stored].isnan().any() and ml[i, :, stored:].isnan().all()


def _nan_partials(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """decode's partials, filled with NaN: what stays NaN was never written."""
    made: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = triton_kernels.partials

    def nan_partials(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        part, ml = real(*args)
        made.append((part.fill_(float("nan")), ml.fill_(float("nan"))))
        return made[-1]

    monkeypatch.setattr(triton_kernels, "partials", nan_partials)
    return made


def test_decode_splits_only_where_the_rows_leave_the_device_idle() -> None:
    """Llama-3-8B's 8 KV heads on an H100's 132 SMs, a graph's table 8,192 keys wide."""
    width = 8192 // 16
    assert [triton_kernels.decode_splits(b * 8, 132, width, 16) for b in (1, 2, 8, 16, 32, 128)] == [
        16, 8, 2, 1, 1, 1
    ]  # fmt: skip
    assert triton_kernels.decode_splits(8, 132, 2, 16) == 1  # 32 keys: one split whatever the batch
    assert triton_kernels.decode_splits(8, 132, 40, 16) == 3  # 640 keys: three of >= 256


def test_a_wide_table_with_short_rows_writes_no_partials(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a CUDA graph: the table as wide as the longest context the graph serves, the rows far
    shorter. The grid has 16 splits; each row runs its own few and the rest store nothing."""
    contexts = [3, 40, 300, 700]
    k_cache, v_cache, table, dense = _cache(contexts, 16, 2, 16, seed=4)
    table = torch.cat([table, torch.zeros(4, 300 - table.shape[1], dtype=torch.int32)], 1)  # 4,800 keys
    q = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(3))
    out = torch.full_like(q, float("nan"))
    written = _nan_partials(monkeypatch)
    triton_kernels.decode(q, k_cache, v_cache, out, table, torch.tensor(contexts, dtype=torch.int32), 0.25,
                          None, sms=1000)  # fmt: skip
    for i, (keys, values) in enumerate(dense):
        torch.testing.assert_close(out[i : i + 1], _reference(q[i : i + 1], keys, values, None))
    [(part, _)] = written
    assert part.shape[2] == 16
    stored = [int((~part[i, 0, :, 0].isnan()).sum()) for i in range(4)]
    assert stored == [0, 0, 2, 3]  # 3 and 40 keys: one split, stored whole; 300: 2; 700: 3


def test_decode_with_one_split_needs_no_reduce() -> None:
    contexts = [3, 40, 11]
    k_cache, v_cache, table, dense = _cache(contexts, 16, 2, 16, seed=3)
    assert triton_kernels.decode_splits(3 * 2, 132, table.shape[1], 16) == 1
    q = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(2))
    out = torch.empty_like(q)
    ctx = torch.tensor(contexts, dtype=torch.int32)
    triton_kernels.decode(q, k_cache, v_cache, out, table, ctx, 0.25, None, sms=132)
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
