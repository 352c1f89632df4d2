"""benchmarks/kv_locality.py's block layouts: each is what its name says, and no block is used twice."""

from __future__ import annotations

import random

import pytest

from benchmarks.kv_locality import BLOCK, LAYOUTS, block_tables

CONTEXTS = [3 * BLOCK, BLOCK + 1, 5 * BLOCK - 2, 1]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_row_gets_its_blocks_once(layout: str) -> None:
    tables = block_tables(layout, CONTEXTS, 64, random.Random(0))
    assert [len(t) for t in tables] == [3, 2, 5, 1]
    ids = [b for t in tables for b in t]
    assert len(set(ids)) == len(ids) and all(0 <= b < 64 for b in ids)


def test_layouts_differ_as_named() -> None:
    contiguous = block_tables("contiguous", CONTEXTS, 64, random.Random(0))
    assert all(t == list(range(t[0], t[0] + len(t))) for t in contiguous)
    interleaved = block_tables("interleaved", CONTEXTS, 64, random.Random(0))
    assert interleaved == [[0, 4, 7], [1, 5], [2, 6, 8, 9, 10], [3]]  # block j of every row, then j + 1
    shuffled = block_tables("shuffled", CONTEXTS, 64, random.Random(0))
    assert shuffled not in (contiguous, interleaved)


def test_refuses_a_cache_too_small_and_an_unknown_layout() -> None:
    with pytest.raises(ValueError, match="11 blocks needed, the cache has 10"):
        block_tables("contiguous", CONTEXTS, 10, random.Random(0))
    with pytest.raises(ValueError, match="layout 'random'"):
        block_tables("random", CONTEXTS, 64, random.Random(0))
