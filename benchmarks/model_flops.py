"""Model FLOPs of a workload, for the benchmarks' model FLOP utilisation (MFU).

Two counts. `flops_per_token`: 2 × the parameters a token goes through (the GEMMs), what the
benchmarks have always reported. `attention_flops`: what attention adds, the scores (q·k) and the
weighted sum of values (p·v) over every query-key pair a causal forward computes, 4 × layers ×
query heads × head_dim FLOPs a pair, as PaLM's MFU counts it (Chowdhery et al. 2022, appendix B).
It grows with context: on the default model it adds 6.4 % to the GEMMs' count on benchmarks/engine.py's
mixed workload (prompts 32-512, outputs 16-256) and 5.7 % on the peer workload (256 in, 128 out).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def flops_per_token(config: Any) -> tuple[float, float]:
    """(prompt token, generated token): a generated token also goes through the lm_head."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q = config.num_attention_heads * head_dim
    kv = config.num_key_value_heads * head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i
    body = layers * per_layer
    lm_head = h * config.vocab_size
    return 2.0 * body, 2.0 * (body + lm_head)


def attended_pairs(prompt_len: int, generated: int) -> int:
    """Query-key pairs of one sequence's causal forwards: its prompt (query i sees keys 1..i), then
    each generated token but the last fed back (the j-th sees the prompt and j keys after it)."""
    prefill = prompt_len * (prompt_len + 1) // 2
    fed_back = max(generated - 1, 0)
    return prefill + fed_back * prompt_len + fed_back * (fed_back + 1) // 2


def attention_flops(config: Any, sequences: Iterable[tuple[int, int]]) -> float:
    """Attention's FLOPs over (prompt length, tokens generated) sequences, full causal attention
    (a sliding window would attend fewer pairs; the default model has none)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_pair = 4.0 * config.num_hidden_layers * config.num_attention_heads * head_dim
    return per_pair * sum(attended_pairs(p, g) for p, g in sequences)
