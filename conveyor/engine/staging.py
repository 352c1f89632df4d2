"""A step's small index tensors (token ids, positions, slots, block tables) onto the device
without making the host wait.

A copy to the GPU from pageable memory (`torch.tensor(values, device="cuda")`) returns only once it
has run, and it runs after everything already queued on the stream: each one a full synchronize,
so the GPU idles while the host prepares the next thing. Staged in pinned memory and copied with
non_blocking=True, the host queues the copy and goes on; the consumers are on the same stream, so
they still see it. torch's caching host allocator hands out the pinned blocks and keeps each one
until its copy has run, so a reused block is never overwritten early. On CPU the host tensor is
the result, as `torch.tensor(values)` was: no pinning, no copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(values: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:  # fmt: skip
    """`values` as a `dtype` tensor on `device`; on CUDA copied from pinned memory, non-blocking."""
    on_cuda = device.type == "cuda"
    if isinstance(values, torch.Tensor):
        host = values.to(dtype)
        if on_cuda:
            host = host.pin_memory()
    else:
        host = torch.tensor(values, dtype=dtype, pin_memory=on_cuda)
    return host.to(device, non_blocking=True) if on_cuda else host
