"""Typed call of the sampler's fused greedy pick (greedy.cpp, extensions.GREEDY), built on first use.

If it cannot be built, `load()` gives None, logged once, and the sampler keeps its torch path
(log_softmax + argmax): slower, with the same tokens.
"""

from __future__ import annotations

from types import ModuleType

import torch

from conveyor.engine.native import extensions


def load() -> ModuleType | None:
    return extensions.load(extensions.GREEDY)


def usable(logits: torch.Tensor) -> bool:
    return logits.device.type == "cpu" and logits.dtype == torch.float32 and load() is not None


def greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of [rows, vocab] float32 CPU logits: the argmax (long) and its logprob (float32)."""
    module = load()
    if module is None:
        raise RuntimeError("greedy() called without a built kernel: check usable() first")
    return module.greedy(logits)
