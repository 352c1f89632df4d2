"""Building and loading the engine's C++ extensions (the sources in this folder), in one place.

torch's cpp_extension compiles an extension once into a cache directory ($TORCH_EXTENSIONS_DIR, else
~/.cache/conveyor/torch_extensions) and later processes load the built module in well under a
second. The directory is keyed by torch's version, the CPU's feature flags (the code is built with
-march=native: a cache shared between machines never hands one a binary for the other's
instructions) and the sources' contents and flags, so checkouts with different kernels never
rebuild each other's. The sources are copied into that directory and built from there: torch's
ninja file names its sources by absolute path, so two checkouts of the same sources building from
their own paths would each rewrite it and recompile what the other had just built.

torch serialises builds with a lock *file* in the build directory and waits for it to go away,
forever: a process killed while it compiled (an OOM kill, a liveness probe, Ctrl-C) leaves it
behind, and every later start of a worker hangs. So the build also holds an flock on a file beside
it, which the kernel releases when its holder dies, however it dies: whoever holds the flock is the
only process that can be compiling, and a lock file it finds is stale and removed.

If an extension cannot be built (no C++ compiler, no Python headers) `load` logs it once and gives
None; its callers keep their torch path (slower, never broken), and `unavailable_reason` says why.
`conveyor kernels` builds them all ahead of time.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

NATIVE_DIR = Path(__file__).parent
INSTALL_HINT = "install a C++ compiler and the Python headers (e.g. apt-get install g++ python3-dev)"
TORCH_BATON = "lock"  # the file torch's FileBaton creates in the build directory
_FLAGS = ("-O3", "-march=native", "-fopenmp")


@dataclass(frozen=True, slots=True)
class Extension:
    name: str  # the Python module's name
    what: str  # for log lines
    fallback: str  # what runs without it
    sources: tuple[str, ...]  # compiled, in this folder
    headers: tuple[str, ...] = ()
    cflags: tuple[str, ...] = _FLAGS

    @property
    def files(self) -> tuple[str, ...]:
        return self.sources + self.headers


ATTENTION = Extension(
    "conveyor_paged_decode", "the CPU attention kernels", "torch attention (gather + SDPA)",
    ("paged_decode.cpp", "paged_prefill.cpp", "kv_write.cpp"), ("simd_avx2.h", "simd_avx512.h", "kv_load.h"),
)
GREEDY = Extension("conveyor_greedy", "the sampler's greedy kernel", "log_softmax + argmax", ("greedy.cpp",))
# No FMA contraction beyond the explicit ones: rope rounds as torch's mul_ + addcmul.
FUSED = Extension(
    "conveyor_fused_ops", "the model's fused ops and C++ layer loop", "torch's ops and the Python layer loop",
    ("fused_ops.cpp", "layer_loop.cpp"), ("fused_ops.h",),
    ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp"),
)
EXTENSIONS = (ATTENTION, GREEDY, FUSED)

_unavailable: dict[str, str] = {}  # extension name -> why the last load() gave None


def cache_root() -> Path:
    default = Path.home() / ".cache" / "conveyor" / "torch_extensions"
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or default)


def cpu_tag() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = next(line for line in lines if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return hashlib.sha1(f"{platform.machine()} {flags}".encode()).hexdigest()[:10]


def build_dir(ext: Extension, source_dir: Path = NATIVE_DIR) -> Path:
    """The cache directory of `ext` built from `source_dir`'s copy of its files: keyed by torch's
    version, the CPU's flags, the files' names and contents and the flags, never by the path."""
    import torch

    digest = hashlib.sha1(" ".join(ext.cflags).encode())
    for name in ext.files:
        digest.update(name.encode() + b"\0" + (source_dir / name).read_bytes())
    version = torch.__version__.replace("+", "_")
    return cache_root() / f"{ext.name}-{version}-{cpu_tag()}-{digest.hexdigest()[:8]}"


def build(ext: Extension, source_dir: Path = NATIVE_DIR) -> ModuleType:
    """The compiled module of `ext` (compiled now unless the cache has it); raises when it cannot
    be built. One process at a time per build directory."""
    from torch.utils import cpp_extension

    build = build_dir(ext, source_dir)
    build.mkdir(parents=True, exist_ok=True)
    with open(build / "conveyor.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released by the kernel if this process dies
        baton = build / TORCH_BATON
        if baton.exists():
            logger.warning("removing %s, left by a process killed while it compiled %s", baton, ext.name)
            baton.unlink(missing_ok=True)
        copies = build / "src"
        copies.mkdir(exist_ok=True)
        for name in ext.files:  # the directory is keyed by their contents: a copy there is the same
            if not (copies / name).exists():
                shutil.copyfile(source_dir / name, copies / f"{name}.tmp")
                (copies / f"{name}.tmp").replace(copies / name)
        return cpp_extension.load(name=ext.name, sources=[str(copies / s) for s in ext.sources],
                                  extra_cflags=list(ext.cflags), extra_ldflags=["-fopenmp"],
                                  build_directory=str(build), verbose=False)


def is_built(ext: Extension) -> bool:
    return any(build_dir(ext).glob("*.so"))


@functools.cache
def load(ext: Extension) -> ModuleType | None:
    """The compiled module, or None when it cannot be built (logged once, with the reason)."""
    _unavailable.pop(ext.name, None)
    fresh = not is_built(ext)
    if fresh:
        logger.info("compiling %s (one time, ~15 s; `conveyor kernels` does it ahead) into %s",
                    ext.what, build_dir(ext))
    t0 = time.perf_counter()
    try:
        module = build(ext)
    except Exception as exc:  # noqa: BLE001 - any build failure must leave the torch path working
        _unavailable[ext.name] = f"{build_failure(exc)}; {INSTALL_HINT}"
        logger.warning("could not build %s, falling back to %s (%s)", ext.what, ext.fallback,
                       _unavailable[ext.name])
        return None
    if fresh:
        logger.info("%s compiled in %.0f s", ext.what, time.perf_counter() - t0)
    return module


def unavailable_reason(ext: Extension) -> str | None:
    """Why load(ext) gives None and what to do about it (None when it is built)."""
    load(ext)
    return _unavailable.get(ext.name)


def build_failure(exc: Exception) -> str:
    cxx = os.environ.get("CXX", "c++")  # the compiler torch's cpp_extension runs
    if shutil.which(cxx) is None:
        return f"no C++ compiler: {cxx!r} is not on PATH"
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message.splitlines()[-1] if message else ''}"
