"""The CPU attention kernels of another git ref, built as a second extension beside this tree's,
so one process can time both on the same inputs (benchmarks/decode_attention.py,
benchmarks/prefill_attention.py, whose --engine runs the engine on both).

The ref's paged_decode.cpp, its paged_prefill.cpp where it has one, and the headers they include
are copied out of git into a fresh directory; its prefill op is registered under
torch.ops.conveyor_base instead of torch.ops.conveyor, so the two builds do not clash.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DIR = "engine/attention"


def _show(ref: str, path: str) -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{path}"], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


class RefKernels:
    """paged_decode / paged_prefill of git ref `ref`, with cpu_kernel's signatures."""

    def __init__(self, ref: str, name: str = "base") -> None:
        from torch.utils import cpp_extension

        self.ref = ref
        build = Path(tempfile.mkdtemp(prefix=f"kernel-{name}-"))
        sources = []
        for stem in ("paged_decode.cpp", "paged_prefill.cpp"):
            text = _show(ref, f"{DIR}/{stem}")
            if text is None:
                continue
            fragment = "TORCH_LIBRARY_FRAGMENT(conveyor"
            text = text.replace(f"{fragment},", f"{fragment}_{name},")
            for header in re.findall(r'#include "([^"]+)"', text):
                body = _show(ref, f"{DIR}/{header}")
                if body is not None:
                    (build / header).write_text(body)
            (build / stem).write_text(text)
            sources.append(str(build / stem))
        if not sources:
            raise SystemExit(f"{ref} has no {DIR}/paged_decode.cpp")
        self.has_prefill = len(sources) == 2
        self.module = cpp_extension.load(
            name=f"conveyor_paged_decode_{name}",
            sources=sources,
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            verbose=False,
        )
        self._ns = name

    def paged_decode(self, q, k_cache, v_cache, tables, context, scale, window, *partition):  # type: ignore[no-untyped-def]
        w = -1 if window is None else window
        return self.module.paged_decode(q, k_cache, v_cache, tables, context, scale, w, *partition)

    def paged_prefill(self, q, k_cache, v_cache, tables, starts, lens, scale, window, out=None):  # type: ignore[no-untyped-def]
        out = torch.empty(q.shape, dtype=q.dtype) if out is None else out
        op = getattr(torch.ops, f"conveyor_{self._ns}").paged_prefill
        op(q, k_cache, v_cache, tables, starts, lens, scale, -1 if window is None else window, out)
        return out
