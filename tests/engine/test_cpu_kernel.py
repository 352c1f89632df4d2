"""The C++ paged decode kernel against a dense reference, and its fallback when it cannot be built."""

from __future__ import annotations

import functools
import logging
import os
import random
import sys

import pytest
import torch
import torch.nn.functional as F

from conveyor.engine.attention import AttentionGeometry, select_attention
from conveyor.engine.attention.torch_paged import keys_by_token
from conveyor.engine.native import extensions
from conveyor.engine.native import paged_attention as cpu_kernel
from tests.engine.kernel_builds import KernelBuild, cpu_flags, each_build  # noqa: F401 - the fixture


@pytest.fixture
def kernel() -> None:
    """Skips, naming what is missing, when the kernel cannot be built here; fails in CI (CI=true),
    which must build it: a skipped kernel would leave the engine's CPU fast path untested."""
    if cpu_kernel.load() is not None:
        return
    reason = f"CPU attention kernel not built: {cpu_kernel.unavailable_reason()}"
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{reason} (CI=true: CI must build the kernel, so this is a failure, not a skip)")
    pytest.skip(reason)


needs_kernel = pytest.mark.usefixtures("kernel")


def _case(rows: int, heads: int, kv: int, hd: int, bs: int, seed: int = 0, max_ctx: int = 70):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    num_blocks = rows * (-(-max_ctx // bs)) + 3
    k_cache = torch.randn(num_blocks + 1, kv, bs, hd, generator=g) * 2  # peaky scores
    v_cache = torch.randn(num_blocks + 1, kv, bs, hd, generator=g)
    q = torch.randn(rows, heads, hd, generator=g) * 2
    free = list(range(num_blocks))
    rng.shuffle(free)
    ctxs = [1, bs, bs + 1, max_ctx][:rows] + [rng.randint(1, max_ctx) for _ in range(rows - 4)]
    width = -(-max(ctxs) // bs)
    tables = [[free.pop() for _ in range(-(-c // bs))] for c in ctxs]
    padded = torch.tensor([t + [num_blocks] * (width - len(t)) for t in tables], dtype=torch.int32)
    return q, k_cache, v_cache, tables, ctxs, padded


def _reference(q, k_cache, v_cache, tables, ctxs, window):
    heads, kv, hd = q.shape[1], k_cache.shape[1], q.shape[2]
    out = []
    for i, (table, ctx) in enumerate(zip(tables, ctxs, strict=True)):
        keys = keys_by_token(k_cache)[table].reshape(-1, kv, hd)[:ctx].double()
        values = v_cache[table].transpose(1, 2).reshape(-1, kv, hd)[:ctx].double()
        first = 0 if window is None else max(0, ctx - window)
        keys, values = keys[first:], values[first:]
        rep = heads // kv
        keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
        res = F.scaled_dot_product_attention(
            q[i].double()[:, None], keys.transpose(0, 1), values.transpose(0, 1), scale=hd**-0.5
        )
        out.append(res[:, 0])
    return torch.stack(out).float()


@needs_kernel
@pytest.mark.parametrize(
    "heads,kv,hd,bs",
    [
        (9, 3, 64, 16),  # SmolLM2
        (8, 2, 32, 16),  # group of 4: the vector path's query groups of three plus one
        (4, 4, 32, 4),  # no GQA
        (8, 2, 16, 5),  # block size not a power of two
        (6, 2, 12, 8),  # head_dim not a multiple of 8: scalar path
        (12, 1, 8, 16),  # group of 12, head_dim 8: AVX-512 scores, p @ V below 16 floats
        (6, 3, 80, 16),  # head_dim 64 + 16: AVX-512 p @ V's 4-zmm and 1-zmm steps, group of 2
        (4, 2, 48, 16),  # head_dim 48: 1-zmm steps only
        (3, 3, 66, 16),  # head_dim not a multiple of 4 or 16: the AVX2 / scalar fallbacks
    ],
)
@pytest.mark.parametrize("window", [None, 7])
def test_matches_reference(heads: int, kv: int, hd: int, bs: int, window: int | None) -> None:
    q, k_cache, v_cache, tables, ctxs, padded = _case(12, heads, kv, hd, bs)
    out = cpu_kernel.paged_decode(
        q, k_cache, v_cache, padded, torch.tensor(ctxs, dtype=torch.int32), hd**-0.5, window
    )
    torch.testing.assert_close(
        out, _reference(q, k_cache, v_cache, tables, ctxs, window), rtol=1e-4, atol=1e-5
    )


@needs_kernel
@pytest.mark.parametrize("partition", [None, 5, 16, 48])  # None: the default (256)
@pytest.mark.parametrize("window", [None, 300])
def test_partitions_match_reference(partition: int | None, window: int | None) -> None:
    """Contexts longer than a partition are split and reduced: same result as one softmax."""
    q, k_cache, v_cache, tables, ctxs, padded = _case(8, 9, 3, 64, 16, seed=1, max_ctx=700)
    args = (q, k_cache, v_cache, padded, torch.tensor(ctxs, dtype=torch.int32), 0.125, window)
    if partition is None:
        out = cpu_kernel.paged_decode(*args)
    else:
        out = cpu_kernel.load().paged_decode(*args[:-1], -1 if window is None else window, partition)
    expected = _reference(q, k_cache, v_cache, tables, ctxs, window)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


@needs_kernel
def test_batch_invariant() -> None:
    """A row's output is bitwise the same alone, in a batch, and with any thread count."""
    q, k_cache, v_cache, _, ctxs, padded = _case(16, 9, 3, 64, 16, max_ctx=800)  # split rows too
    ctx = torch.tensor(ctxs, dtype=torch.int32)
    full = cpu_kernel.paged_decode(q, k_cache, v_cache, padded, ctx, 0.125, None)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = cpu_kernel.paged_decode(q, k_cache, v_cache, padded, ctx, 0.125, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(full, single)
    assert max(ctxs) > 256  # the default partition: some rows are split
    for i in (0, 5, 15):
        alone = cpu_kernel.paged_decode(
            q[i : i + 1], k_cache, v_cache, padded[i : i + 1], ctx[i : i + 1], 0.125, None
        )
        assert torch.equal(alone[0], full[i])


@needs_kernel
def test_strided_queries_and_output_buffer() -> None:
    """q as the model hands it (the first heads of the rotated q|k rows) and rows of a larger
    output buffer: the same bits as contiguous q into a fresh tensor, nothing outside the rows
    written; rows whose heads are not contiguous are refused."""
    q, k_cache, v_cache, _, ctxs, padded = _case(10, 9, 3, 64, 16, seed=2, max_ctx=600)
    ctx = torch.tensor(ctxs, dtype=torch.int32)
    want = cpu_kernel.paged_decode(q, k_cache, v_cache, padded, ctx, 0.125, None)
    qk = torch.randn(10, 12, 64)
    qk[:, :9] = q
    buffer = torch.full((14, 9, 64), 7.0)
    got = cpu_kernel.paged_decode(qk[:, :9], k_cache, v_cache, padded, ctx, 0.125, None, out=buffer[:10])
    assert got.data_ptr() == buffer.data_ptr()
    assert torch.equal(buffer[:10], want)
    assert torch.equal(buffer[10:], torch.full((4, 9, 64), 7.0))
    with pytest.raises(RuntimeError, match="each row's heads contiguous"):
        cpu_kernel.paged_decode(q.transpose(1, 2).contiguous().transpose(1, 2), k_cache, v_cache, padded, ctx,
                                0.125, None)
    one_head = q[:, :1].clone()  # a size-1 dimension's stride is free: still accepted
    k1, v1 = k_cache[:, :1].contiguous(), v_cache[:, :1].contiguous()
    odd_stride = one_head.as_strided(one_head.shape, (64, 7, 1))
    assert torch.equal(cpu_kernel.paged_decode(odd_stride, k1, v1, padded, ctx, 0.125, None),
                       cpu_kernel.paged_decode(one_head, k1, v1, padded, ctx, 0.125, None))
    with pytest.raises(RuntimeError, match="out: fp32 of q's shape"):
        cpu_kernel.paged_decode(q, k_cache, v_cache, padded, ctx, 0.125, None, out=buffer[:9])


# Head dims and block sizes that leave each vector path a tail: the vector scores only at block
# size 16 (4, 5 and 17 take the scalar scores); p @ V in 64-float steps (64), then 16-float steps
# (80 = 64 + 16, 96 = 64 + 16 + 16), 8-float steps where 16 does not divide (72 = 64 + 8: the AVX2
# steps in an AVX-512 build) and a scalar tail (66 = 64 + 2, also the AVX2 scores at block size 16).
HEAD_DIMS = [64, 72, 80, 96, 66]
BLOCK_SIZES = [4, 5, 16, 17]


@functools.cache
def _bf16_case(hd: int, bs: int):  # type: ignore[no-untyped-def]
    """A case over a bf16 cache and its float64 reference: computed once, shared by every build's
    test (the reference costs more than the kernel)."""
    q, k_cache, v_cache, tables, ctxs, padded = _case(8, 8, 2, hd, bs, max_ctx=300)  # groups of 3 + 1
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    expected = _reference(q, k16.float(), v16.float(), tables, ctxs, None)
    return q, k16, v16, padded, torch.tensor(ctxs, dtype=torch.int32), expected


@needs_kernel
@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize("hd", HEAD_DIMS)
def test_bf16_cache_reads_as_its_fp32_widening(build: KernelBuild, hd: int, bs: int) -> None:
    """--kv-cache-dtype bfloat16: the kernel widens each loaded element and the arithmetic stays
    fp32, so the result is bitwise that of the cache's fp32 widening, on every path of every build."""
    q, k16, v16, padded, ctx, expected = _bf16_case(hd, bs)
    out = build.paged_decode(q, k16, v16, padded, ctx, hd**-0.5, -1, 48)  # split rows too
    assert out.dtype == torch.float32
    assert torch.equal(out, build.paged_decode(q, k16.float(), v16.float(), padded, ctx, hd**-0.5, -1, 48))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="both the same"):
        build.paged_decode(q, k16, v16.float(), padded, ctx, hd**-0.5, -1, 48)


@needs_kernel
def test_rejects_bad_block_ids() -> None:
    q, k_cache, v_cache, _, ctxs, padded = _case(4, 4, 2, 16, 4)
    padded[0, 0] = k_cache.shape[0]
    with pytest.raises(RuntimeError, match="block id out of range"):
        cpu_kernel.paged_decode(
            q, k_cache, v_cache, padded, torch.tensor(ctxs, dtype=torch.int32), 0.25, None
        )


@needs_kernel
def test_each_build_takes_its_paths(build: KernelBuild) -> None:
    """The native build (-march=native) has the AVX-512 paths on a CPU with AVX-512F, the AVX2
    paths on one with AVX2 + FMA; the other builds the paths they are named for, so the tests
    above run each path."""
    if build.isa == "native":
        flags = cpu_flags()
        expected = "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else "scalar"
    else:
        expected = build.isa
    assert build.simd() == expected


def _geometry() -> AttentionGeometry:
    return AttentionGeometry(4, 2, 16, 4, 32, torch.device("cpu"), torch.float32)


@needs_kernel
def test_the_cpu_backend_is_chosen_on_cpu_and_torch_turns_it_off() -> None:
    assert select_attention(_geometry()).name == "cpu"
    assert select_attention(_geometry(), "torch").name == "torch"  # --attention torch: no C++ kernels
    bf16_model = AttentionGeometry(4, 2, 16, 4, 32, torch.device("cpu"), torch.bfloat16)
    assert select_attention(bf16_model).name == "torch"  # the kernels take fp32 queries


def test_build_failure_falls_back(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from torch.utils import cpp_extension

    def broken(**_: object) -> None:
        raise RuntimeError("Error building extension: g++: command not found")

    monkeypatch.setenv("CXX", sys.executable)  # a "compiler" that exists: the build's error is the reason
    monkeypatch.setattr(cpp_extension, "load", broken)
    extensions.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert select_attention(_geometry()).name == "torch"
        assert "apt-get install g++" in caplog.text
        reason = cpu_kernel.unavailable_reason()
        assert reason is not None and "g++: command not found" in reason and reason in caplog.text
    finally:
        monkeypatch.undo()
        extensions.load.cache_clear()


def test_missing_compiler_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils import cpp_extension

    def broken(**_: object) -> None:
        raise RuntimeError("Error building extension 'conveyor_paged_decode'")

    monkeypatch.setenv("CXX", "no-such-c++")
    monkeypatch.setattr(cpp_extension, "load", broken)
    extensions.load.cache_clear()
    try:
        reason = cpu_kernel.unavailable_reason()
        assert reason == f"no C++ compiler: 'no-such-c++' is not on PATH; {extensions.INSTALL_HINT}"
    finally:
        monkeypatch.undo()
        extensions.load.cache_clear()


@needs_kernel
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_write_kv_stores_what_index_put_stores(build: KernelBuild, kv_dtype: torch.dtype) -> None:
    """kv_write.cpp against the torch path it replaces (index_put_ on the caches' token views after
    Tensor.to): the same bits in the same places, from strided k/v as the qkv projection gives them."""
    g = torch.Generator().manual_seed(5)
    blocks, kv, bs, hd, heads = 9, 3, 16, 64, 9
    qkv = torch.randn(40, heads + 2 * kv, hd, generator=g) * 3
    k, v = qkv[:, heads : heads + kv], qkv[:, heads + kv :]
    slots = torch.randperm(blocks * bs, generator=g)[:40]
    ours = [torch.zeros(blocks, kv, bs, hd, dtype=kv_dtype) for _ in range(2)]
    build.write_kv(k, v, ours[0], ours[1], slots)
    ref = [torch.zeros(blocks, kv, bs, hd, dtype=kv_dtype) for _ in range(2)]
    where = (slots // bs, slots % bs)
    keys_by_token(ref[0]).index_put_(where, k.to(kv_dtype))
    ref[1].transpose(1, 2).index_put_(where, v.to(kv_dtype))
    assert torch.equal(ours[0], ref[0]) and torch.equal(ours[1], ref[1])
    assert ours[0].count_nonzero() == 40 * kv * hd  # every token written, nothing else
    bad = slots.clone()
    bad[-1] = blocks * bs
    before = ours[0].clone()
    with pytest.raises(RuntimeError, match="out of range"):
        build.write_kv(k * 2, v, ours[0], ours[1], bad)
    assert torch.equal(ours[0], before)  # checked before any write
