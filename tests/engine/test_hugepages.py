"""conveyor/engine/hugepages.py: the CPU KV cache's memory is advised for huge pages before it is touched."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from conveyor.engine import hugepages
from conveyor.engine.kv_cache import KVCache

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _eligible(address: int) -> bool:
    """THPeligible of the mapping holding `address`, from /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "THPeligible:":
            return line.split()[1] == "1"
    return False


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not THP.exists() or "[never]" in THP.read_text(),
    reason="needs Linux with transparent huge pages not turned off",
)
def test_kv_cache_memory_is_advised() -> None:
    cache = KVCache(2, 512, 16, (513, 3, 16, 64), torch.float32, torch.device("cpu"))
    assert cache.huge_pages
    assert _eligible(cache.k[1].data_ptr())
    assert not torch.any(cache.k[0]) and not torch.any(cache.v[1])  # still zeroed


def test_small_or_non_cpu_tensors_are_left_alone() -> None:
    assert not hugepages.advise(torch.empty(1024))
    assert not hugepages.advise(torch.empty(4 << 20, device="meta"))
