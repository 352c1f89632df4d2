"""Activation buffers reused from step to step on CPU, by name.

On CPU a fresh tensor of tens of MB is mmap'ed and page-faulted anew each time it is allocated, so a
step's large activations live in buffers that grow to the largest batch seen and are handed out
as views. Elsewhere each call gives a fresh tensor: CUDA's caching allocator is cheap, and a
captured graph must never see a buffer that a later, larger batch reallocates. A view is valid
until the next call with the same name: its user must be done with it by then.
"""

from __future__ import annotations

import math

import torch


class Workspace:
    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, dtype
        self._flat: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        if self.device.type != "cpu":
            return torch.empty(shape, dtype=self.dtype, device=self.device)
        size = math.prod(shape)
        flat = self._flat.get(name)
        if flat is None or flat.numel() < size:
            flat = self._flat[name] = torch.empty(size, dtype=self.dtype, device=self.device)
        return flat[:size].view(shape)
