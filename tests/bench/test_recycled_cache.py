"""benchmarks/recycled_cache.py's pure parts: the layout measure and the workload it times."""

from __future__ import annotations

from benchmarks.recycled_cache import mixed, neighbours


def test_neighbours_counts_forward_and_backward_steps() -> None:
    assert neighbours([[3, 4, 5], [9, 8], [1, 7]]) == (2 / 4, 1 / 4)
    assert neighbours([[2], []]) == (0.0, 0.0)


def test_mixed_workload_is_seeded_and_in_range() -> None:
    a, b = mixed(1, 1000), mixed(5, 1000)
    assert a == mixed(1, 1000) and a != b and len(a) == 64
    assert all(32 <= len(p) <= 512 and 16 <= n <= 256 and all(0 <= t < 1000 for t in p) for p, n in a + b)
