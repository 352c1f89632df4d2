"""The sampler's fused greedy pick (greedy.cpp), built on first use like the attention kernel.

Compiled once into the same cache root as engine/attention/cpu_kernel.py (keyed by torch version,
source and CPU flags); if it cannot be built, `load()` gives None once, logged, and the sampler keeps
its torch path (log_softmax + argmax): slower, with the same tokens.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path
from types import ModuleType

import torch

from engine.attention import cpu_kernel

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("greedy.cpp")


@functools.cache
def load() -> ModuleType | None:
    """The compiled module, or None when it cannot be built (logged once)."""
    from torch.utils import cpp_extension

    digest = hashlib.sha1(_SOURCE.read_bytes()).hexdigest()[:10]
    build = cpu_kernel._build_dir().with_name(f"greedy-{torch.__version__.replace('+', '_')}-{digest}")
    build.mkdir(parents=True, exist_ok=True)
    try:
        return cpp_extension.load(
            name="conveyor_greedy",
            sources=[str(_SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            verbose=False,
        )
    except Exception as exc:  # noqa: BLE001 - any build failure must leave the torch path working
        logger.warning("could not build the sampler's greedy kernel, using log_softmax + argmax (%s: %s); %s",
                       type(exc).__name__, str(exc).strip().splitlines()[-1:] or "", cpu_kernel.INSTALL_HINT)
        return None


def usable(logits: torch.Tensor) -> bool:
    return logits.device.type == "cpu" and logits.dtype == torch.float32 and load() is not None


def greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of [rows, vocab] float32 CPU logits: the argmax (long) and its logprob (float32)."""
    module = load()
    if module is None:
        raise RuntimeError("greedy() called without a built kernel: check usable() first")
    return module.greedy(logits)
