"""The sampler's fused greedy pick (greedy.cpp), built on first use like the attention kernel.

Compiled once into the same cache root as conveyor/engine/attention/cpu_kernel.py (keyed by torch version
and CPU flags; torch rebuilds it when the source changes). If it cannot be built, `load()` gives
None, logged once, and the sampler keeps its torch path (log_softmax + argmax): slower, with the
same tokens.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from types import ModuleType

import torch

from conveyor.engine import native_build
from conveyor.engine.attention import cpu_kernel

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("greedy.cpp")


@functools.cache
def load() -> ModuleType | None:
    """The compiled module, or None when it cannot be built (logged once)."""
    # Beside the attention kernel's build, keyed the same way (torch version, CPU flags: -march=native,
    # source), so a checkout with another greedy.cpp never loads this one's binary.
    build = cpu_kernel.build_dir("greedy", [_SOURCE])
    try:
        return native_build.load("conveyor_greedy", [_SOURCE], build, ["-O3", "-march=native", "-fopenmp"])
    except Exception as exc:  # noqa: BLE001 - any build failure must leave the torch path working
        last = (str(exc).strip().splitlines() or [""])[-1]
        logger.warning("could not build the sampler's greedy kernel, using log_softmax + argmax (%s: %s); %s",
                       type(exc).__name__, last, cpu_kernel.INSTALL_HINT)
        return None


def usable(logits: torch.Tensor) -> bool:
    return logits.device.type == "cpu" and logits.dtype == torch.float32 and load() is not None


def greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of [rows, vocab] float32 CPU logits: the argmax (long) and its logprob (float32)."""
    module = load()
    if module is None:
        raise RuntimeError("greedy() called without a built kernel: check usable() first")
    return module.greedy(logits)
