"""The startup heap, frozen once a process is ready to serve.

CPython's collector scans every tracked object of a generation it collects; an api or worker process
keeps hundreds of thousands of them alive from its start (modules, pydantic schemas, the tokenizer,
FastAPI's routes, the model's modules), while the objects serving makes (events, requests, chunks)
live for milliseconds. `gc.freeze()` moves what is alive now out of the collector's view, so a
collection costs what serving allocated, not the whole heap (as vLLM does after its warm-up). A
collection first, so that startup's garbage is freed rather than kept for good.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("conveyor")


def freeze_startup_heap(role: str) -> int:
    """Collects, then freezes every object alive now; returns how many were frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("%s: %d startup objects frozen out of the garbage collector's scans", role, frozen)
    return frozen
