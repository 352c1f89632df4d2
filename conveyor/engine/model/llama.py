"""Llama-family forward (Llama, Mistral, Qwen2, SmolLM) over one flattened batch without padding.

Weights come from a transformers model; the batch layout and the attention are ours. q/k/v are
fused into one linear and gate/up into another: fewer, wider GEMMs run closer to the matmul peak.
"""

from __future__ import annotations

import copy
import functools
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from conveyor.engine.attention import Attend, AttentionBackend, NativePlan, attend_after_write, native_plan
from conveyor.engine.model import SUPPORTED_MODEL_TYPES
from conveyor.engine.model.layer_stack import MLP_ROWS, build_layer_stack
from conveyor.engine.model.linear import Linear, exact_min_rows
from conveyor.engine.model.row_padding import padded_rows
from conveyor.engine.native import fused_ops
from conveyor.engine.step_observer import StepObserver
from conveyor.engine.workspace import Workspace

logger = logging.getLogger(__name__)

# RoPE variants whose frequencies depend on the longest position seen: computed per step by
# transformers with data-dependent control flow, so they cannot be captured in a CUDA graph.
_DYNAMIC_ROPE = ("dynamic", "longrope")
_LM_HEAD_SLICE = 4096
# Below ~12 rows MKL's fp32 GEMM (oneDNN's at 1 row) picks kernels whose rounding depends on the
# row count, so a sequence's logits would depend on the batch it is in. Padding to the fewest rows
# at which each weight's GEMM is checked exact at load (linear.exact_min_rows; at most 16) keeps
# them exact: with oneDNN that is 2 here, and a step of 2 rows runs its GEMMs several times faster
# than 16.
# Above it the bits are the same, so a step is padded to the fastest count (row_padding.py; 5 here).
_CPU_MIN_ROWS = 16


@dataclass(slots=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: Linear
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear
    down: Linear
    window: int | None  # sliding-window attention span, None: full causal


class Llama:
    def __init__(self, hf_model: nn.Module, device: torch.device, dtype: torch.dtype,
                 bf16_gemms: bool = False) -> None:
        """`bf16_gemms`: the layers' GEMMs in bfloat16 on a CPU that has them (linear.py; the
        lm_head stays fp32)."""
        hf: Any = hf_model  # transformers modules are untyped attribute bags
        cfg = hf.config
        if cfg.model_type not in SUPPORTED_MODEL_TYPES:
            supported = ", ".join(SUPPORTED_MODEL_TYPES)
            raise ValueError(f"model type {cfg.model_type!r} is not supported; supported: {supported}")
        self.device, self.dtype = device, dtype
        self.num_layers: int = cfg.num_hidden_layers
        self.num_heads: int = cfg.num_attention_heads
        self.num_kv_heads: int = cfg.num_key_value_heads
        self.head_dim: int = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.hidden_size: int = cfg.hidden_size
        self.intermediate_size: int = cfg.intermediate_size
        self.vocab_size: int = cfg.vocab_size
        self.max_positions: int = cfg.max_position_embeddings
        self.eps: float = cfg.rms_norm_eps
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} heads cannot share {self.num_kv_heads} KV heads evenly")
        from transformers.activations import ACT2FN

        self.act = ACT2FN[cfg.hidden_act]
        self.silu = cfg.hidden_act == "silu"
        cpu = device.type == "cpu"
        self.min_rows = self.exact_rows = _CPU_MIN_ROWS if cpu else 1
        # fused_ops.cpp's silu_and_mul and rope on CPU in float32 where it is built, else None:
        # torch's ops (the same bits).
        self.fused: ModuleType | None = fused_ops.for_model(device, dtype)
        # F.rms_norm for float32 on CPU: one op, the same bits as _rms_norm's five (tests check it);
        # with the fused module, its rms_norm at the vector width that gives F.rms_norm's bits here
        # (0: none does, F.rms_norm). One pass instead of F.rms_norm's five ops: about half its time
        # a call at decode sizes.
        self.fused_norm = cpu and dtype == torch.float32
        self.norm_lanes = fused_ops.norm_lanes(self.hidden_size, self.eps) if self.fused is not None else 0
        self._workspace = Workspace(device, dtype)

        base = hf.model
        self.embed = self._param(base.embed_tokens.weight)
        lm_head: torch.Tensor = hf.lm_head.weight
        self.tied_embeddings = lm_head.data_ptr() == base.embed_tokens.weight.data_ptr()
        self.lm_head = Linear(self.embed if self.tied_embeddings else self._param(lm_head))
        self.norm = self._param(base.norm.weight)
        self.bf16_gemms = bf16_gemms
        self.layers = [self._layer(layer, i, cfg) for i, layer in enumerate(base.layers)]
        # The layers' GEMMs: bfloat16 where asked and the CPU has them (linear.py), else the model's dtype.
        self.gemm_dtype = torch.bfloat16 if any(la.qkv.bf16 for la in self.layers) else dtype
        if cpu:
            gemms = ((la.qkv, la.o, la.gate_up, la.down) for la in self.layers)
            linears = [self.lm_head, *(linear for four in gemms for linear in four)]
            self.exact_rows = exact_min_rows(linears, _CPU_MIN_ROWS)
            self.min_rows = padded_rows(linears, self.exact_rows, _CPU_MIN_ROWS)
        # transformers' rotary module gives cos/sin for every RoPE scaling type; a copy, so that
        # moving it to our device leaves the caller's model alone.
        self.rotary = copy.deepcopy(base.rotary_emb).to(device)
        self.graph_safe = getattr(self.rotary, "rope_type", "default") not in _DYNAMIC_ROPE
        # The layer loop in one C++ call (layer_loop.cpp), where every piece of it has its kernel;
        # else None: the Python loop below.
        self.layer_stack: Any = build_layer_stack(self)
        self.observer: StepObserver | None = None  # Engine.observe sets it

    def _param(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device=self.device, dtype=self.dtype).contiguous()

    def _optional(self, t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else self._param(t)

    def _layer(self, layer: Any, index: int, cfg: Any) -> _Layer:
        att, mlp = layer.self_attn, layer.mlp
        projections = (att.q_proj, att.k_proj, att.v_proj)
        biases = [p.bias for p in projections]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            biases = [
                b if b is not None else p.weight.new_zeros(p.out_features)
                for b, p in zip(biases, projections, strict=True)
            ]
        qkv_bias = None if biases[0] is None else torch.cat(biases)
        gate, up = mlp.gate_proj, mlp.up_proj
        gate_up_bias = None if gate.bias is None else torch.cat([gate.bias, up.bias])
        return _Layer(
            input_norm=self._param(layer.input_layernorm.weight),
            qkv=self._linear(torch.cat([p.weight for p in projections]), qkv_bias),
            o=self._linear(att.o_proj.weight, att.o_proj.bias),
            post_norm=self._param(layer.post_attention_layernorm.weight),
            gate_up=self._linear(torch.cat([gate.weight, up.weight]), gate_up_bias),
            down=self._linear(mlp.down_proj.weight, mlp.down_proj.bias),
            window=_window(cfg, index),
        )

    def _linear(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        return Linear(self._param(weight), self._optional(bias), bf16=self.bf16_gemms)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin, [T, 1, head_dim]: once per step, shared by all layers."""
        probe = torch.empty(0, dtype=self.dtype, device=self.device)
        cos, sin = self.rotary(probe, positions[None])
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]
        half = self.head_dim // 2
        # rotate_half(x) * sin == cat(x2, x1) * cat(-sin1, sin2): one cat of x instead of cat + neg.
        return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: Any,
        attention: AttentionBackend,
        k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor],
    ) -> torch.Tensor:
        """Hidden states [T, hidden] after the last layer, before the final norm."""
        n_real = input_ids.shape[0]
        if n_real < self.min_rows:  # padding rows: position 0, never attended, dropped at the end
            input_ids = F.pad(input_ids, (0, self.min_rows - n_real))
            positions = F.pad(positions, (0, self.min_rows - n_real))
        n_tok = input_ids.shape[0]
        heads, kv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        cos, sin = self.rope(positions)
        cos, sin = cos.reshape(n_tok, hd), sin.reshape(n_tok, hd)
        # The step's workspaces and their views, taken once for all layers: per layer, each costs
        # Python and dispatch, a visible part of a small decode step over 30 layers (docs/engine.md).
        norm_out = self._buffer("norm", (n_tok, self.hidden_size))
        h = F.embedding(input_ids, self.embed)
        # The CUDA backends' loop, through the fused Triton kernels where Triton is importable.
        if (attend := attend_after_write(attention)) is not None and (kernels := _triton_fused()) is not None:
            return self._fused_layers(kernels, h, cos, sin, n_real, norm_out, attend, meta, k_cache, v_cache)
        qk = self._buffer("qk", (n_tok, heads + kv, hd))  # q and k rotated (_rope)
        # The C++ loop is built over the fused ops: a model without them (tests switch them off to
        # compare bits) takes the Python loop; so does a backend without a plan for it.
        if self.layer_stack is not None and self.fused is not None and self.fused_norm and self.norm_lanes:
            plan = native_plan(attention, meta)
            if plan is not None:
                return self._native_layers(self.fused, h, cos, sin, n_real, norm_out, qk, plan, k_cache,
                                           v_cache)
        q, k = qk[:n_real, :heads], qk[:n_real, heads:]
        v_cols = slice((heads + kv) * hd, None)
        sliced = self.device.type == "cpu" and n_tok > MLP_ROWS  # see _mlp
        act = None if sliced else self._buffer("act", (n_tok, self.intermediate_size))
        for i, layer in enumerate(self.layers):
            qkv = self._apply(layer.qkv, self._rms_norm(h, layer.input_norm, norm_out), "qkv")
            self._rope(qkv, cos, sin, qk)
            v = qkv[:n_real, v_cols].view(n_real, kv, hd)
            if self.observer is not None:
                self.observer.start("attention")
            att = attention.forward(q, k, v, k_cache[i], v_cache[i], meta, layer.window)
            if self.observer is not None:
                self.observer.stop("attention")
            if n_real < n_tok:
                att = F.pad(att, (0, 0, 0, n_tok - n_real))
            h = layer.o.residual(h, att)
            h = self._mlp(h, layer) if sliced else self._mlp_rows(h, layer, norm_out, act)
        return h[:n_real]

    def _native_layers(
        self, fused: ModuleType, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_real: int,
        norm_out: torch.Tensor, qk: torch.Tensor, plan: NativePlan, k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor],
    ) -> torch.Tensor:
        """The loop below in one C++ call (layer_loop.cpp): the same kernels in the same order, the
        same bits, without the interpreter between them (and without the GIL)."""
        n_tok = h.shape[0]
        act = self._buffer("act", (min(n_tok, MLP_ROWS), self.intermediate_size))
        att = self._buffer("att", (n_tok, self.num_heads, self.head_dim))
        step = fused.StepAttention(plan.slots, plan.decode_tables, plan.context, plan.prefill_tables,
                                        plan.starts, plan.lens, plan.scale)
        out = self.layer_stack.forward(h, cos, sin, n_real, norm_out, qk, act, att, k_cache, v_cache, step)
        if self.observer is not None:
            self.observer.native(self.layer_stack.last_timings())
        return out[:n_real]

    def _fused_layers(
        self, kernels: ModuleType, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_real: int,
        norm_out: torch.Tensor, attend: Attend, meta: Any, k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor],
    ) -> torch.Tensor:
        """The loop of forward() for the CUDA backends, the same math in fewer kernels
        (triton_fused.py), as vLLM's: each GEMM's output is added into the residual by the next
        norm, RoPE writes K and V straight into the cache (the backend then only attends), and
        silu·mul is one pass."""
        n_tok, eps = h.shape[0], self.eps
        q = self._buffer("q", (n_real, self.num_heads, self.head_dim))
        act = self._buffer("act", (n_tok, self.intermediate_size))
        pending: torch.Tensor | None = None  # the last GEMM's output, not yet added into h
        for i, layer in enumerate(self.layers):
            if pending is None:
                normed = kernels.rms_norm(h, layer.input_norm, eps, norm_out)
            else:
                normed, h = kernels.add_rms_norm(pending, h, layer.input_norm, eps, norm_out)
            qkv = self._apply(layer.qkv, normed, "qkv")
            kernels.rope_write_kv(qkv, cos, sin, q, k_cache[i], v_cache[i], meta.slots)
            if self.observer is not None:
                self.observer.start("attention")
            att = attend(q, k_cache[i], v_cache[i], meta, layer.window)
            if self.observer is not None:
                self.observer.stop("attention")
            if n_real < n_tok:  # padding rows (CPU only: min_rows) are never attended
                att = F.pad(att, (0, 0, 0, n_tok - n_real))
            attended = self._apply(layer.o, att, "o")
            normed, h = kernels.add_rms_norm(attended, h, layer.post_norm, eps, norm_out)
            gate_up = self._apply(layer.gate_up, normed, "mlp")
            if self.silu:
                kernels.silu_and_mul(gate_up, act)
            else:
                self._act_mul(gate_up, act)
            pending = self._apply(layer.down, act, "down")
        if pending is not None:
            h += pending
        return h[:n_real]

    def _mlp(self, h: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """h + MLP(norm(h)). Rows are independent here, so on CPU a long batch (prefill) goes through
        in slices of MLP_ROWS rows: the activations stay a few MB, which the allocator reuses and L3
        holds, instead of tens of MB mapped and page-faulted anew in every layer."""
        for lo in range(0, h.shape[0], MLP_ROWS):
            rows = h[lo : lo + MLP_ROWS]
            out = self._mlp_rows(rows, layer)
            if out.data_ptr() != rows.data_ptr():
                rows.copy_(out)
        return h

    def _mlp_rows(
        self, h: torch.Tensor, layer: _Layer, norm_out: torch.Tensor | None = None,
        act: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """h + MLP(norm(h)), into the given buffers (h's rows) where given, else workspaces."""
        gate_up = self._apply(layer.gate_up, self._rms_norm(h, layer.post_norm, norm_out), "mlp")
        return layer.down.residual(h, self._act_mul(gate_up, act))

    def _rope(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, qk: torch.Tensor) -> None:
        """q and k of the qkv GEMM's output, rotated, into qk [T, heads + kv_heads, head_dim];
        cos and sin [T, head_dim] (sin sign-folded, see rope())."""
        if self.fused is not None:  # one pass, the same bits as the three below
            self.fused.rope(qkv, cos, sin, qk.shape[1], qk)
            return
        # q*cos + rotate_half(q)*sin in three passes, into workspaces.
        half = self.head_dim // 2
        x = qkv[:, : qk.shape[1] * self.head_dim].view(qk.shape)
        rot = torch.cat((x[..., half:], x[..., :half]), dim=-1, out=self._buffer("rot", qk.shape))
        torch.addcmul(rot.mul_(sin[:, None]), x, cos[:, None], out=qk)

    def _act_mul(self, gate_up: torch.Tensor, act: torch.Tensor | None = None) -> torch.Tensor:
        """act(gate) * up of the gate_up GEMM's output [T, 2 * inter], into `act` [T, inter] (else
        a workspace)."""
        inter = self.intermediate_size
        # Into a contiguous buffer: oneDNN would copy a strided view before the GEMM.
        if act is None:
            act = self._buffer("act", (gate_up.shape[0], inter))
        if self.fused is not None and self.silu:  # one pass over gate_up, the same bits as torch's
            self.fused.silu_and_mul(gate_up, act)
            return act
        gate, up = gate_up[:, :inter], gate_up[:, inter:]
        gate = F.silu(gate, inplace=True) if self.silu else gate.copy_(self.act(gate))
        return torch.mul(gate, up, out=act)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits for the given rows only (the rows that sample)."""
        n_real = hidden.shape[0]
        x = self._rms_norm(F.pad(hidden, (0, 0, 0, max(0, self.min_rows - n_real))), self.norm)
        if self.lm_head.packed or self.device.type != "cpu":
            return self.lm_head(x)[:n_real].float()
        # torch.mm on CPU: slices of the vocabulary keep each GEMM's output in L2, which is faster
        # (docs/engine.md).
        out = self._buffer("logits", (x.shape[0], self.vocab_size))
        for lo in range(0, self.vocab_size, _LM_HEAD_SLICE):
            hi = min(lo + _LM_HEAD_SLICE, self.vocab_size)
            torch.mm(x, self.lm_head.weight[lo:hi].t(), out=out[:, lo:hi])
        return out[:n_real].float()

    def _buffer(self, name: str, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        """A reused activation buffer (conveyor/engine/workspace.py)."""
        return self._workspace(name, shape)

    def _apply(self, linear: Linear, x: torch.Tensor, name: str) -> torch.Tensor:
        """linear(x), into workspace `name` when the GEMM takes an output buffer."""
        out = None if linear.packed else self._buffer(name, (x.shape[0], linear.out_features))
        return linear(x, out)

    def _rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """RMS norm of x's rows, into `out` (x's shape) when the fused kernel runs (else a workspace)."""
        if self.fused_norm:
            if self.fused is not None and self.norm_lanes and x.stride(-1) == 1:  # one pass, same bits
                if out is None:
                    out = self._buffer("norm", x.shape)
                self.fused.rms_norm(x, weight, self.eps, self.norm_lanes, out)
                return out
            return F.rms_norm(x, weight.shape, weight, self.eps)
        # As transformers does it: normalise in float32, cast back, then scale.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(x.dtype)


def _window(cfg: Any, index: int) -> int | None:
    """Sliding window of layer `index`: Qwen2 marks layers in `layer_types`, Mistral sets it globally."""
    window = getattr(cfg, "sliding_window", None)
    if window is None:
        return None
    # Mistral applies its window to every layer whatever `layer_types` says; Qwen2 only to those marked.
    layer_types = None if cfg.model_type == "mistral" else getattr(cfg, "layer_types", None)
    if layer_types is not None and layer_types[index] != "sliding_attention":
        return None
    return int(window)


@functools.cache
def _triton_fused() -> ModuleType | None:
    """The fused Triton kernels (triton_fused.py), imported once, the first time a CUDA backend
    runs; None, said once, where Triton cannot be imported: the unfused loop runs instead."""
    try:
        from conveyor.engine.model import triton_fused
    except ImportError as exc:
        logger.warning("fused Triton kernels unavailable (%s): the CUDA path runs torch's unfused ops, "
                       "several more kernel launches per layer", exc)
        return None
    return triton_fused
