"""Keep freed memory in the process on CPU, so large temporaries stop page-faulting every step.

torch's CPU tensors come from malloc. glibc hands a freed chunk at the top of a heap back to the
kernel once more than M_TRIM_THRESHOLD is free there (and serves chunks above the dynamic
M_MMAP_THRESHOLD from fresh mmaps), so a temporary of a few MB — e.g. each op inside `F.rms_norm`
on a 4096-token prefill, 9.4 MB — is mapped and zero-filled anew every time it is allocated. In
this VM a page fault is expensive: `F.rms_norm` over [4096, 576] took 12-24 ms, over [3072, 576]
under 1 ms. Raising both thresholds keeps those pages mapped for the next step (vLLM's CPU build
gets the same from tcmalloc via LD_PRELOAD). The engine's own workspaces (conveyor/engine/model/llama.py
`_buffer`) cover the largest activations; this covers what torch allocates inside its ops.

glibc only (ctypes `mallopt`); elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import logging

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc caps the mmap threshold at half its heap size (32 MiB on 64-bit); larger chunks stay mmaps.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30  # free memory kept at the top of a heap before any goes back

_done = False


def retain_freed_memory() -> bool:
    """Raise glibc's trim and mmap thresholds once per process; True if they are raised."""
    global _done
    if _done:
        return True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, Windows)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    if not ok:
        logger.warning("mallopt refused the thresholds; large CPU temporaries will page-fault each step")
    _done = ok
    return ok
