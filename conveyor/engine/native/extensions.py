"""Compiling the engine's C++ extensions (attention kernels, fused ops, greedy pick) into a cache
shared by every process on the machine, safely when several start at once.

torch's cpp_extension serialises builds with a lock *file* in the build directory and waits for it
to go away, forever: a process killed while it compiled (an OOM kill, a liveness probe, Ctrl-C)
leaves it behind, and every later start of a worker hangs. So the build also holds an flock on a
file beside it, which the kernel releases when its holder dies, however it dies: whoever holds the
flock is the only process that can be compiling, and a lock file it finds is stale and removed.
"""

from __future__ import annotations

import fcntl
import logging
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

TORCH_BATON = "lock"  # the file torch's FileBaton creates in the build directory


def load(name: str, sources: list[Path], build: Path, cflags: list[str]) -> ModuleType:
    """cpp_extension.load of `sources` into `build`, one process at a time (OpenMP linked)."""
    from torch.utils import cpp_extension

    with open(build / "conveyor.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released by the kernel if this process dies
        baton = build / TORCH_BATON
        if baton.exists():
            logger.warning("removing %s, left by a process killed while it compiled %s", baton, name)
            baton.unlink(missing_ok=True)
        return cpp_extension.load(name=name, sources=[str(s) for s in sources], extra_cflags=cflags,
                                  extra_ldflags=["-fopenmp"], build_directory=str(build), verbose=False)
