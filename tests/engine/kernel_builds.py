"""The CPU attention kernels built for each instruction set this machine can run, so that one
machine tests every vector path the engine may take: the engine's own build (-march=native: the
AVX-512 paths on a CPU with AVX-512F), an AVX2 + FMA build (x86-64-v3, what an AVX2-only CPU runs)
and a scalar one (x86-64: no AVX, no FMA). Each is loaded beside the others with its torch ops in
its own namespace (CONVEYOR_OPS, kv_load.h); a build is compiled once into the kernel cache."""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

import pytest
import torch

from conveyor.engine.native import extensions, paged_attention

# isa -> the -march it is built with (None: the engine's own build, -march=native).
MARCH: dict[str, str | None] = {"native": None, "avx2": "x86-64-v3", "scalar": "x86-64"}


@dataclass(frozen=True)
class KernelBuild:
    """One build's paged_decode, paged_prefill and write_kv, with the raw module's signatures."""

    isa: str
    module: ModuleType
    namespace: str  # of its torch ops

    def simd(self) -> str:
        return self.module.simd()

    def paged_decode(self, q, k_cache, v_cache, tables, context, scale, window, partition):  # type: ignore[no-untyped-def]
        return self.module.paged_decode(q, k_cache, v_cache, tables, context, scale, window, partition)

    def paged_prefill(self, q, k_cache, v_cache, tables, starts, lens, scale, window):  # type: ignore[no-untyped-def]
        out = torch.empty(q.shape, dtype=q.dtype)
        getattr(torch.ops, self.namespace).paged_prefill(q, k_cache, v_cache, tables, starts, lens, scale,
                                                         window, out)
        return out

    def write_kv(self, k, v, k_cache, v_cache, slots) -> None:  # type: ignore[no-untyped-def]
        getattr(torch.ops, self.namespace).write_kv(k, v, k_cache, v_cache, slots)


def cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    return set(next(line for line in cpuinfo if line.startswith("flags")).split())


def skip_reason(isa: str) -> str | None:
    """Why this machine does not test `isa`'s build, or None when it does."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the {isa} build is x86 code; this is {platform.machine()}"
    flags = cpu_flags()
    if isa == "avx2" and not {"avx2", "fma"} <= flags:
        return "this CPU has no AVX2 + FMA: it cannot run the AVX2 build"
    if isa == "avx2" and "avx512f" not in flags:
        return "this CPU has no AVX-512F: its native build is the AVX2 build, tested as native"
    return None


@functools.cache
def _load(isa: str) -> KernelBuild:
    namespace = f"conveyor_{isa}"
    variant = replace(extensions.ATTENTION, name=f"conveyor_paged_decode_{isa}",
                      cflags=("-O3", f"-march={MARCH[isa]}", "-fopenmp", f"-DCONVEYOR_OPS={namespace}"))
    return KernelBuild(isa, extensions.build(variant), namespace)


def kernel_build(isa: str) -> KernelBuild:
    """`isa`'s build (the caller has the native one: the `kernel` fixture); skips with the reason
    where this machine cannot run it or runs it as its native build."""
    if isa == "native":
        return KernelBuild(isa, paged_attention.load(), "conveyor")
    reason = skip_reason(isa)
    if reason is not None:
        pytest.skip(reason)
    return _load(isa)


@pytest.fixture(params=list(MARCH), name="build")
def each_build(request: pytest.FixtureRequest, kernel: None) -> KernelBuild:
    """Each instruction set's build in turn (tests using it run once per isa)."""
    return kernel_build(request.param)
