"""The startup heap freeze (conveyor/launcher/heap.py): what is alive is frozen out of the
collector's scans, and startup's garbage is collected first, not kept for good."""

from __future__ import annotations

import gc
import weakref

from conveyor.launcher.heap import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_garbage_is_collected_and_the_rest_frozen() -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only a collection frees it
    gone = weakref.ref(a)
    kept = Node()
    del a, b
    try:
        frozen = freeze_startup_heap("test")
        assert gone() is None, "startup garbage was frozen instead of collected"
        assert frozen == gc.get_freeze_count() > 0
        assert all(o is not kept for o in gc.get_objects())  # frozen: out of every generation
    finally:
        gc.unfreeze()
