"""Fused Triton kernels for the model's CUDA path: RMS norm with the residual add, silu(gate)·up,
and RoPE with the KV-cache write. Each replaces several torch ops (and their launches) with one.

- rms_norm / add_rms_norm: one program per row. add_rms_norm adds x into the residual in place and
  normalises the sum, as vLLM's fused_add_rms_norm: the residual is rounded to its dtype before it
  is normalised, then normalised in fp32, cast back, and scaled (transformers' LlamaRMSNorm order).
- silu_and_mul: act = silu(gate) * up over the gate_up GEMM's output [T, 2 * inter].
- rope_write_kv: rotates q and k of the qkv GEMM's output with the step's cos and sign-folded sin
  (Llama.rope), writes q into a contiguous buffer and k and v straight into the paged cache at the
  step's slots, in the CUDA backends' layout [num_blocks + 1, block_size, kv_heads, head_dim]
  (cuda.cuda_layout): no rotated k, no q.contiguous(), no index_copy_.

Math is fp32 inside each kernel, one rounding to the output's dtype. Runs on CUDA, and on CPU under
Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported), which the tests use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_ACT_BLOCK = 1024  # columns of act per silu_and_mul program


def _warps(block: int) -> int:
    return min(8, max(1, block // 256))


@triton.jit
def _rms_norm_kernel(x_ptr, x_stride, res_ptr, res_stride, w_ptr, out_ptr, out_stride, n_cols, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=ok, other=0.0).to(tl.float32)
        summed = (x + r).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + row * res_stride + cols, summed, mask=ok)
        x = summed.to(tl.float32)  # the residual as stored, as the unfused ops normalise it
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=ok)


def _norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
          out: torch.Tensor) -> None:  # fmt: skip
    if x.stride(-1) != 1 or out.stride(-1) != 1 or (residual is not None and residual.stride(-1) != 1):
        raise ValueError("rms_norm wants rows with unit column stride")
    n_cols = x.shape[-1]
    block = triton.next_power_of_2(n_cols)
    res = x if residual is None else residual  # unread when there is no residual
    _rms_norm_kernel[(x.shape[0],)](
        x, x.stride(0), res, res.stride(0), weight, out, out.stride(0), n_cols, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=_warps(block),
    )  # fmt: skip


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> torch.Tensor:
    """RMS norm of x's rows [T, hidden] into `out` (x's shape)."""
    _norm(x, None, weight, eps, out)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """residual += x in place, then its RMS norm into `out`: (out, residual)."""
    _norm(x, residual, weight, eps, out)
    return out, residual


@triton.jit
def _silu_mul_kernel(gu_ptr, gu_stride, out_ptr, out_stride, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    gate = tl.load(gu_ptr + row * gu_stride + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * gu_stride + inter + cols, mask=ok, other=0.0).to(tl.float32)
    # silu rounded to the output's dtype before the product, as torch's two ops round it.
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (act * up).to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(gate_up: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [T, 2 * inter] into `out` [T, inter]."""
    inter = out.shape[1]
    if gate_up.shape[1] != 2 * inter or gate_up.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError(f"silu_and_mul wants gate_up [T, {2 * inter}] and out [T, {inter}], "
                         "both with unit column stride")
    grid = (gate_up.shape[0], triton.cdiv(inter, _ACT_BLOCK))
    _silu_mul_kernel[grid](gate_up, gate_up.stride(0), out, out.stride(0), inter, BLOCK=_ACT_BLOCK,
                           num_warps=4)  # fmt: skip
    return out


@triton.jit
def _rope_kv_kernel(qkv_ptr, qkv_stride, cos_ptr, sin_ptr, cs_stride, q_ptr, q_stride, k_cache_ptr,
                    v_cache_ptr, slots_ptr, NUM_HEADS: tl.constexpr, NUM_KV: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """One (row, head): a q head (head < NUM_HEADS) rotated into q; else a KV head, its k rotated
    and its v as is, into the cache at the row's slot."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    ok = d < HEAD_DIM
    # rotate_half(x) * sin == cat(x2, x1) * sign-folded sin: x's other half, at (d + half) mod dim.
    partner = (d + HEAD_DIM // 2) % HEAD_DIM
    src = qkv_ptr + row * qkv_stride + head * HEAD_DIM
    x = tl.load(src + d, mask=ok, other=0.0).to(tl.float32)
    x_other = tl.load(src + partner, mask=ok, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + row * cs_stride + d, mask=ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + row * cs_stride + d, mask=ok, other=0.0).to(tl.float32)
    rotated = x * cos + x_other * sin
    if head < NUM_HEADS:
        tl.store(q_ptr + row * q_stride + head * HEAD_DIM + d, rotated.to(q_ptr.dtype.element_ty), mask=ok)
    else:
        kvh = head - NUM_HEADS
        slot = tl.load(slots_ptr + row).to(tl.int64)
        dst = (slot * NUM_KV + kvh) * HEAD_DIM + d
        tl.store(k_cache_ptr + dst, rotated.to(k_cache_ptr.dtype.element_ty), mask=ok)
        v = tl.load(src + NUM_KV * HEAD_DIM + d, mask=ok, other=0.0)  # v follows k in qkv's columns
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=ok)


def rope_write_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slots: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """q and k of qkv [T, (heads + 2 * kv_heads) * head_dim] rotated (cos, sin [T, head_dim], sin
    sign-folded): q into `q` [rows, heads, head_dim], k and v into the caches at `slots` [rows];
    rows = len(slots) <= T (rows past them are padding and are skipped). Returns q."""
    rows, heads, head_dim = q.shape
    kv = k_cache.shape[-2]
    if qkv.shape[1] != (heads + 2 * kv) * head_dim or k_cache.shape[-1] != head_dim or head_dim % 2:
        raise ValueError(f"rope_write_kv: qkv {tuple(qkv.shape)} does not hold {heads} q and {kv} KV heads "
                         f"of (even) dim {head_dim} for a cache of {tuple(k_cache.shape)}")
    contiguous = q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()
    if slots.shape[0] != rows or not contiguous:
        raise ValueError("rope_write_kv wants a slot per q row and contiguous q and caches")
    if qkv.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1 or cos.stride(0) != sin.stride(0):
        raise ValueError("rope_write_kv wants qkv, cos and sin rows with unit column stride")
    if rows:
        _rope_kv_kernel[(rows, heads + kv)](
            qkv, qkv.stride(0), cos, sin, cos.stride(0), q, q.stride(0), k_cache, v_cache, slots,
            NUM_HEADS=heads, NUM_KV=kv, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
            num_warps=1 if head_dim <= 64 else 2,
        )  # fmt: skip
    return q
