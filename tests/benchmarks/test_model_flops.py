"""benchmarks/model_flops.py: the attention FLOPs of a workload, against a count of a causal mask."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from benchmarks.model_flops import attended_pairs, attention_flops, flops_per_token


def pairs_by_mask(prompt_len: int, generated: int) -> int:
    """Query-key pairs the forwards compute: the prompt in one causal forward, then each generated
    token but the last fed back alone, attending to everything before it and itself."""
    total = int(torch.ones(prompt_len, prompt_len).tril().sum())
    for j in range(1, generated):  # the j-th generated token is fed back at position prompt_len + j
        total += prompt_len + j
    return total


@pytest.mark.parametrize(("prompt_len", "generated"), [(1, 1), (3, 2), (7, 1), (5, 9), (256, 128), (32, 0)])
def test_pairs_match_a_causal_mask(prompt_len: int, generated: int) -> None:
    assert attended_pairs(prompt_len, generated) == pairs_by_mask(prompt_len, generated)


def test_attention_flops_count_four_per_pair_per_head_dim_and_layer() -> None:
    config = SimpleNamespace(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                             num_hidden_layers=3, intermediate_size=128, vocab_size=100)
    sequences = [(3, 2), (5, 1)]
    # (3, 2): 6 prompt pairs + 4 for the fed-back token; (5, 1): 15 prompt pairs
    assert attention_flops(config, iter(sequences)) == 4 * 3 * 4 * 16 * (10 + 15)
    config.head_dim = 8  # an explicit head_dim wins over hidden_size / heads
    assert attention_flops(config, sequences) == 4 * 3 * 4 * 8 * 25


def test_flops_per_token_counts_the_lm_head_for_generated_tokens_only() -> None:
    config = SimpleNamespace(hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
                             num_hidden_layers=2, intermediate_size=16, vocab_size=10)
    prompt, generated = flops_per_token(config)
    per_layer = 8 * 8 + 2 * 8 * 4 + 8 * 8 + 3 * 8 * 16  # q, k and v, o, gate/up/down
    assert prompt == 2 * 2 * per_layer
    assert generated - prompt == 2 * 8 * 10
