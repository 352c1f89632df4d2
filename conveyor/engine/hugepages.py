"""Transparent huge pages for the CPU KV cache.

The CPU decode kernel reads each row's context block by block, and a row's blocks lie anywhere
in a cache of gigabytes: with 4 KiB pages every 12 KiB block costs its own TLB misses and page
walks. Backed by 2 MiB pages the same reads take markedly less time (docs/engine.md, "AVX-512",
has the figures). Linux backs anonymous
memory with huge pages only where asked when THP is in "madvise" mode (the common default), so
the cache's memory is advised before its first touch. Anywhere else this is a no-op: never an
error, at worst the 4 KiB pages of before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys

import torch

logger = logging.getLogger(__name__)

_MADV_HUGEPAGE = 14  # <linux/mman.h>
_PAGE = 4096
_HUGE = 2 * 1024 * 1024


@functools.cache
def _madvise():  # type: ignore[no-untyped-def]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise(tensor: torch.Tensor) -> bool:
    """Ask for huge pages under a CPU tensor not yet touched; True if the kernel took the advice."""
    madvise = _madvise()
    nbytes = tensor.numel() * tensor.element_size()
    if madvise is None or tensor.device.type != "cpu" or nbytes < _HUGE:
        return False
    start = (tensor.data_ptr() + _PAGE - 1) // _PAGE * _PAGE  # madvise wants a page-aligned start
    length = tensor.data_ptr() + nbytes - start
    if madvise(start, length, _MADV_HUGEPAGE) != 0:
        logger.debug("madvise(MADV_HUGEPAGE) failed: errno %d", ctypes.get_errno())
        return False
    return True
