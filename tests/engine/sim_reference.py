"""The simulated engine's token rule as docs/operations/simulated-engine.md states it, written out
again here (not imported from conveyor/engine/sim.py), so that tests compare the sim to its spec."""

from __future__ import annotations

import hashlib
from array import array
from typing import Any

M64 = 2**64 - 1


def reference_vocab(tokenizer: Any) -> list[int]:
    """Ordinary tokens: not special or added, decoding alone to text without U+FFFD."""
    skip = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    out = []
    for i in range(len(tokenizer)):
        if i not in skip:
            text = tokenizer.decode([i])
            if text and "\ufffd" not in text:
                out.append(i)
    return out


def reference(vocab: list[int], prompt: list[int], n: int, salt: int = 0) -> list[int]:
    """The first `n` tokens the sim draws for `prompt` (salt: 0 greedy, else the seed)."""
    h = int.from_bytes(hashlib.blake2b(salt.to_bytes(8, "little") + array("I", prompt).tobytes(),
                                       digest_size=8).digest(), "little")
    out = []
    for _ in range(n):
        out.append(vocab[h % len(vocab)])
        z = ((h ^ out[-1]) + 0x9E3779B97F4A7C15) & M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        h = z ^ (z >> 31)
    return out
