"""The prefix cache's chained block hash, shared by the engine and the api (docs/design.md §4, §3).

The engine's block manager registers each full, computed KV block under `block_hash(parent, tokens)`;
the api computes the same chain from a job's token ids alone (`prefix_hashes`) to find the worker
that already holds the job's prefix (prefix-affinity placement, conveyor/jobqueue/placement.py). One function
for both, so they agree by construction. Pure Python and stable across processes and machines
(BLAKE2b of fixed-width little-endian integers, not Python's salted `hash()`); a hit is still
verified against the block's tokens in the engine, so a collision costs a hit, never wrong KV.
"""

from __future__ import annotations

import sys
from array import array
from hashlib import blake2b

_ROOT = (0).to_bytes(8, "little")  # the first block's parent
_MASK = (1 << 64) - 1


def block_hash(parent: int | None, token_ids: tuple[int, ...] | list[int]) -> int:
    """Chained hash of one full block: 64 bits over (parent hash, the block's token ids)."""
    tokens = array("q", token_ids)
    if sys.byteorder != "little":  # the same bytes on every machine
        tokens.byteswap()
    head = _ROOT if parent is None else (parent & _MASK).to_bytes(8, "little")
    return int.from_bytes(blake2b(head + tokens.tobytes(), digest_size=8).digest(), "little")


def prefix_hashes(token_ids: list[int], block_size: int, max_blocks: int | None = None) -> list[int]:
    """The chain of hashes of the prompt's full blocks that a prefix-cache hit can cover: those within
    the first len - 1 tokens (the engine computes the last token for its logits), at most `max_blocks`."""
    count = max(0, len(token_ids) - 1) // block_size
    if max_blocks is not None:
        count = min(count, max_blocks)
    out: list[int] = []
    parent: int | None = None
    for i in range(count):
        parent = block_hash(parent, token_ids[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out
