"""The C++ paged prefill kernel against a dense float64 reference, its batch invariance, and the
torch backend routing prefill chunks through it."""

from __future__ import annotations

import functools
import random

import pytest
import torch
import torch.nn.functional as F

from conveyor.engine.attention import AttentionBatch, AttentionGeometry
from conveyor.engine.attention.cpu import CpuAttention
from conveyor.engine.attention.torch_paged import TorchAttention, keys_by_token
from conveyor.engine.native import paged_attention as cpu_kernel
from tests.engine.kernel_builds import KernelBuild, each_build  # noqa: F401 - the fixture
from tests.engine.test_cpu_kernel import (
    BLOCK_SIZES,
    HEAD_DIMS,
    kernel,  # noqa: F401 - the fixture: skip (or fail in CI) without a build
)

needs_kernel = pytest.mark.usefixtures("kernel")

# (start, length): fresh prompts, one-row chunks, partial blocks, chunked prefill with start > 0.
_CHUNKS = [(0, 1), (0, 16), (0, 37), (5, 20), (16, 16), (33, 50), (0, 100), (70, 1), (3, 2)]


def _case(chunks: list[tuple[int, int]], heads: int, kv: int, hd: int, bs: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    need = [-(-(s + n) // bs) for s, n in chunks]
    num_blocks = sum(need) + 3
    # Blocks past a chunk's context hold NaN: the kernel must never read them.
    k_cache = torch.full((num_blocks + 1, kv, bs, hd), float("nan"))
    v_cache = torch.full((num_blocks + 1, kv, bs, hd), float("nan"))
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(w)] for w in need]
    for (s, n), table in zip(chunks, tables, strict=True):
        ctx = s + n
        keys = torch.randn(ctx, kv, hd, generator=g) * 2  # peaky scores
        values = torch.randn(ctx, kv, hd, generator=g)
        for pos in range(ctx):
            block, off = table[pos // bs], pos % bs
            keys_by_token(k_cache)[block, off] = keys[pos]
            v_cache[block, :, off] = values[pos]
    q = torch.randn(sum(n for _, n in chunks), heads, hd, generator=g) * 2
    width = max(need)
    padded = torch.tensor([t + [num_blocks] * (width - len(t)) for t in tables], dtype=torch.int32)
    starts = torch.tensor([s for s, _ in chunks], dtype=torch.int32)
    lens = torch.tensor([n for _, n in chunks], dtype=torch.int32)
    return q, k_cache, v_cache, tables, padded, starts, lens


def _reference(q, k_cache, v_cache, tables, chunks, window):
    kv, hd = k_cache.shape[1], q.shape[2]
    out, row = [], 0
    for (start, n), table in zip(chunks, tables, strict=True):
        ctx = start + n
        keys = keys_by_token(k_cache)[table].reshape(-1, kv, hd)[:ctx].double()
        values = v_cache[table].transpose(1, 2).reshape(-1, kv, hd)[:ctx].double()
        qpos = torch.arange(start, ctx)[:, None]
        kpos = torch.arange(ctx)[None, :]
        valid = kpos <= qpos
        if window is not None:
            valid &= kpos > qpos - window
        res = F.scaled_dot_product_attention(
            q[row : row + n].double().transpose(0, 1),
            keys.transpose(0, 1),
            values.transpose(0, 1),
            attn_mask=valid,
            scale=hd**-0.5,
            enable_gqa=True,
        )
        out.append(res.transpose(0, 1))
        row += n
    return torch.cat(out).float()


def _run(q, k_cache, v_cache, padded, starts, lens, window, scale):
    return cpu_kernel.paged_prefill(q, k_cache, v_cache, padded, starts, lens, scale, window)


@needs_kernel
@pytest.mark.parametrize(
    "heads,kv,hd,bs",
    [
        (9, 3, 64, 16),  # SmolLM2
        (8, 2, 32, 16),  # group of 4
        (4, 4, 32, 4),  # no GQA, small blocks: scalar score path
        (8, 2, 16, 5),  # block size not a power of two
        (6, 2, 12, 8),  # head_dim not a multiple of 8
        (12, 1, 8, 16),  # one KV head for twelve query heads
        (6, 3, 80, 16),  # head_dim 64 + 16: AVX-512 p @ V's 4-zmm and 1-zmm steps
        (3, 3, 66, 16),  # head_dim not a multiple of 16: the AVX2 / scalar p @ V
    ],
)
@pytest.mark.parametrize("window", [None, 1, 7, 40])
def test_matches_reference(heads: int, kv: int, hd: int, bs: int, window: int | None) -> None:
    q, k_cache, v_cache, tables, padded, starts, lens = _case(_CHUNKS, heads, kv, hd, bs)
    out = _run(q, k_cache, v_cache, padded, starts, lens, window, hd**-0.5)
    ref = _reference(q, k_cache, v_cache, tables, _CHUNKS, window)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("window", [None, 23])
def test_batch_invariant(window: int | None) -> None:
    """A row's output is bitwise the same in a batch, alone, from another split of its prompt into
    chunks, and with any thread count."""
    chunks = [(0, 300), (17, 45), (0, 9), (128, 200)]
    q, k_cache, v_cache, _, padded, starts, lens = _case(chunks, 9, 3, 64, 16, seed=1)
    full = _run(q, k_cache, v_cache, padded, starts, lens, window, 0.125)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = _run(q, k_cache, v_cache, padded, starts, lens, window, 0.125)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(full, single)
    row = 0
    for i, (start, n) in enumerate(chunks):
        rows = slice(row, row + n)
        one = slice(i, i + 1)
        alone = _run(q[rows], k_cache, v_cache, padded[one], starts[one], lens[one], window, 0.125)
        assert torch.equal(alone, full[rows])
        # The same prompt cut in two at an odd row (a tile boundary moves): the later part as a
        # chunk of its own with a start further on.
        cut = n // 2 + 3 if n > 8 else 1
        tail = _run(
            q[row + cut : row + n],
            k_cache,
            v_cache,
            padded[i : i + 1],
            torch.tensor([start + cut], dtype=torch.int32),
            torch.tensor([n - cut], dtype=torch.int32),
            window,
            0.125,
        )
        assert torch.equal(tail, full[row + cut : row + n])
        row += n


@needs_kernel
def test_rejects_bad_input() -> None:
    q, k_cache, v_cache, _, padded, starts, lens = _case([(0, 5), (3, 4)], 4, 2, 16, 4)
    bad = padded.clone()
    bad[1, 0] = k_cache.shape[0]
    with pytest.raises(RuntimeError, match="block id out of range"):
        _run(q, k_cache, v_cache, bad, starts, lens, None, 0.25)
    with pytest.raises(RuntimeError, match="chunks' lengths sum to 9"):
        _run(q[:8], k_cache, v_cache, padded, starts, lens, None, 0.25)
    with pytest.raises(RuntimeError, match="longer than its block table"):
        _run(q, k_cache, v_cache, padded, starts, lens + 8, None, 0.25)


@functools.cache
def _bf16_case(hd: int, bs: int, window: int | None):  # type: ignore[no-untyped-def]
    """_CHUNKS over a bf16 cache and its float64 reference: computed once, shared by every build's
    test (the reference costs more than the kernel)."""
    q, k_cache, v_cache, tables, padded, starts, lens = _case(_CHUNKS, 8, 2, hd, bs)  # groups of 4
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    expected = _reference(q, k16.float(), v16.float(), tables, _CHUNKS, window)
    return q, k16, v16, padded, starts, lens, expected


@needs_kernel
@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("window", [None, 7])
def test_bf16_cache_reads_as_its_fp32_widening(
    build: KernelBuild, hd: int, bs: int, window: int | None
) -> None:
    """Bitwise the result of the cache's fp32 widening, on every path of every build (the spans'
    softmax in vectors at block sizes 4 and 16, scalar at 5 and 17: spans of 60 and 51 keys)."""
    q, k16, v16, padded, starts, lens, expected = _bf16_case(hd, bs, window)
    w = -1 if window is None else window
    out = build.paged_prefill(q, k16, v16, padded, starts, lens, hd**-0.5, w)
    widened = build.paged_prefill(q, k16.float(), v16.float(), padded, starts, lens, hd**-0.5, w)
    assert torch.equal(out, widened)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="both the same"):
        build.paged_prefill(q, k16, v16.float(), padded, starts, lens, hd**-0.5, w)


def _backend_step(
    monkeypatch: pytest.MonkeyPatch, backend_class: type, window: int | None,
    kv_dtype: torch.dtype = torch.float32,
) -> tuple[bool, torch.Tensor]:
    """One mixed step (two decode rows, a fresh prompt, a chunk with start > 0) through the
    backend: (prefill kernel used, output)."""
    calls = 0
    real = cpu_kernel.paged_prefill

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_kernel, "paged_prefill", counted)
    heads, kv, hd, bs, num_blocks = 9, 3, 64, 16, 40
    geometry = AttentionGeometry(heads, kv, hd, bs, num_blocks, torch.device("cpu"), torch.float32, kv_dtype)
    backend = backend_class(geometry)
    g = torch.Generator().manual_seed(3)
    k_cache = torch.randn(backend.cache_shape(), generator=g).to(kv_dtype)
    v_cache = torch.randn(backend.cache_shape(), generator=g).to(kv_dtype)
    query_lens, context_lens = [1, 1, 30, 21], [20, 50, 30, 60]
    tables = [[0, 1], [2, 3, 4, 5], [6, 7], [8, 9, 10, 11]]
    slots = [tables[i][(c - 1) // bs] * bs + (c - 1) % bs for i, c in enumerate(context_lens[:2])]
    for table, n, ctx in zip(tables[2:], query_lens[2:], context_lens[2:], strict=True):
        slots += [table[pos // bs] * bs + pos % bs for pos in range(ctx - n, ctx)]
    batch = AttentionBatch(2, query_lens, context_lens, tables, torch.tensor(slots))
    rows = sum(query_lens)
    qk = torch.randn(rows, heads + kv, hd, generator=g)  # strided views, as the model passes them
    q, k, v = qk[:, :heads], qk[:, heads:], torch.randn(rows, kv, hd, generator=g)
    meta = backend.prepare(batch)
    out = backend.forward(q, k, v, k_cache, v_cache, meta, window)
    monkeypatch.undo()
    return calls > 0, out


@needs_kernel
@pytest.mark.parametrize("window", [None, 9])
def test_backend_uses_kernel_and_matches_sdpa(monkeypatch: pytest.MonkeyPatch, window: int | None) -> None:
    used, fast = _backend_step(monkeypatch, CpuAttention, window)
    skipped, slow = _backend_step(monkeypatch, TorchAttention, window)
    assert used and not skipped
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-5)


@needs_kernel
def test_backend_with_a_bf16_cache_matches_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bfloat16 cache below fp32 queries: the kernels (decode and prefill) and the torch path
    (gather, widen, SDPA) see the same rounded keys and values, the step's own included."""
    used, fast = _backend_step(monkeypatch, CpuAttention, None, torch.bfloat16)
    _, slow = _backend_step(monkeypatch, TorchAttention, None, torch.bfloat16)
    _, fp32 = _backend_step(monkeypatch, CpuAttention, None)
    assert used and fast.dtype == torch.float32
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-5)
    assert not torch.equal(fast, fp32)  # the rounding is real...
    torch.testing.assert_close(fast, fp32, rtol=0.05, atol=0.05)  # ...and small
