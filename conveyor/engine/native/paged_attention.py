"""The C++ paged attention kernels (paged_decode.cpp, paged_prefill.cpp) and the KV write
(kv_write.cpp), built on first use.

torch's cpp_extension compiles it once into a cache directory ($TORCH_EXTENSIONS_DIR, else
~/.cache/conveyor/torch_extensions) and later processes load the built module in well under a
second. It is built with -march=native, so the directory is keyed by the CPU's feature flags: a
cache shared between different machines never hands one a binary for the other's instructions.

CONVEYOR_CPU_ATTENTION=torch turns both off; =decode keeps the decode kernel and sends prefill
chunks through torch SDPA (the path before paged_prefill.cpp, kept for side-by-side benchmarks).
If it cannot be built (no C++ compiler, no Python headers) the engine logs a warning and keeps the
torch attention path: slower, never broken; `unavailable_reason()` says why.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import time
from pathlib import Path
from types import ModuleType

import torch

from conveyor.engine import native_build

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("paged_decode.cpp")
_PREFILL = Path(__file__).with_name("paged_prefill.cpp")  # a torch op in the same module
_WRITE = Path(__file__).with_name("kv_write.cpp")  # another
_HEADERS = [Path(__file__).with_name(name) for name in ("simd_avx2.h", "simd_avx512.h", "kv_load.h")]
ENV = "CONVEYOR_CPU_ATTENTION"
INSTALL_HINT = "install a C++ compiler and the Python headers (e.g. apt-get install g++ python3-dev)"
_unavailable: str | None = None  # why the last load() gave None


def _cpu_tag() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = next(line for line in lines if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return hashlib.sha1(f"{platform.machine()} {flags}".encode()).hexdigest()[:10]


def _build_dir() -> Path:
    return build_dir("paged_decode", [_SOURCE, _PREFILL, _WRITE, *_HEADERS])


def build_dir(name: str, sources: list[Path]) -> Path:
    """The cache directory for extension `name` built from `sources` (shared by the engine's
    other C++ modules): keyed by torch version, CPU flags and the sources' contents."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "conveyor" / "torch_extensions"
    version = torch.__version__.replace("+", "_")
    # Keyed by the sources too: checkouts with different kernels must not rebuild each other's.
    code = b"".join(path.read_bytes() for path in sources)
    digest = hashlib.sha1(code).hexdigest()[:8]
    path = Path(root) / f"{name}-{version}-{_cpu_tag()}-{digest}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def load() -> ModuleType | None:
    """The compiled module, or None when it is turned off or cannot be built (logged once)."""
    global _unavailable
    _unavailable = None
    choice = os.environ.get(ENV, "kernel").strip().lower()
    if choice == "torch":
        _unavailable = f"turned off by {ENV}=torch (unset it to use the kernel)"
        return None
    if choice not in ("kernel", "decode"):
        logger.warning("%s=%r is not 'torch', 'decode' or 'kernel'; using the kernel", ENV, choice)
    build = _build_dir()
    fresh = not any(build.glob("*.so"))
    if fresh:
        logger.info("compiling the CPU attention kernel (one time, ~15 s) into %s", build)
    t0 = time.perf_counter()
    try:
        module = native_build.load("conveyor_paged_decode", [_SOURCE, _PREFILL, _WRITE], build,
                                   ["-O3", "-march=native", "-fopenmp"])
    except Exception as exc:  # noqa: BLE001 - any build failure must leave the torch path working
        _unavailable = f"{_build_failure(exc)}; {INSTALL_HINT}"
        logger.warning(
            "could not build the CPU attention kernel, using the slower torch attention (%s), "
            "or set %s=torch to skip the attempt.",
            _unavailable,
            ENV,
        )
        return None
    if fresh:
        logger.info("CPU attention kernel compiled in %.0f s", time.perf_counter() - t0)
    return module


def unavailable_reason() -> str | None:
    """Why load() gives None and what to do about it (None when the kernel is built)."""
    load()
    return _unavailable


def _build_failure(exc: Exception) -> str:
    cxx = os.environ.get("CXX", "c++")  # the compiler torch's cpp_extension runs
    if shutil.which(cxx) is None:
        return f"no C++ compiler: {cxx!r} is not on PATH"
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message.splitlines()[-1] if message else ''}"


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    context: torch.Tensor,
    scale: float,
    window: int | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """[rows, heads, head_dim] attention of one query per row over its paged context, into `out`
    when given. q's and out's rows may be strided (each row's heads contiguous)."""
    module = load()
    assert module is not None, "paged_decode called without a built kernel"
    return module.paged_decode(q, k_cache, v_cache, tables, context, scale, -1 if window is None else window,
                               out=out)


def prefill_enabled() -> bool:
    """Whether prefill chunks go through paged_prefill (the kernel is built and not limited to
    decode by CONVEYOR_CPU_ATTENTION=decode)."""
    return load() is not None and os.environ.get(ENV, "kernel").strip().lower() != "decode"


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    starts: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
    window: int | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """[rows, heads, head_dim] causal attention of every prefill chunk's rows over its paged
    context (the chunk's own keys already written to the cache), into `out` when given. q's rows
    may be strided (each row's heads contiguous)."""
    assert load() is not None, "paged_prefill called without a built kernel"
    out = torch.empty(q.shape, dtype=q.dtype) if out is None else out
    torch.ops.conveyor.paged_prefill(
        q, k_cache, v_cache, tables, starts, lens, scale, -1 if window is None else window, out
    )
    return out


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """k, v [tokens, kv_heads, head_dim] (fp32, rows may be strided) into the caches (fp32 or
    bfloat16, rounded as `Tensor.to` rounds) at `slots` [tokens] (int64), in one call."""
    assert load() is not None, "write_kv called without a built kernel"
    torch.ops.conveyor.write_kv(k, v, k_cache, v_cache, slots)
