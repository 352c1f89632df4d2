"""KV tensors, preallocated once from a memory budget and written in place every step."""

from __future__ import annotations

import os

import torch

from conveyor.engine import hugepages
from conveyor.engine.config import DEFAULT_KV_CACHE_FRACTION, EngineConfig

_GIB = 1024**3


def available_memory(device: torch.device) -> int:
    """Bytes of RAM available on the host (CPU's KV cache draws from it)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # psutil is optional: fall back to the kernel's free page count
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def fraction_budget(fraction: float | None, device: torch.device) -> int:
    """Bytes for the KV cache under kv_cache_fraction `fraction` (EngineConfig says what it means;
    None: DEFAULT_KV_CACHE_FRACTION), measured now, after the weights are loaded. May be negative: too
    little room."""
    if fraction is None:
        fraction = DEFAULT_KV_CACHE_FRACTION["cuda" if device.type == "cuda" else "cpu"]
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"kv_cache_fraction must be in (0, 1], got {fraction}")
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # As vLLM: what is in use already (these weights, the CUDA context, other processes)
        # comes out of the worker's share of the whole GPU.
        return int(total * fraction) - (total - free)
    return int(available_memory(device) * fraction)


def plan_num_blocks(config: EngineConfig, bytes_per_block: int, device: torch.device) -> int:
    """Blocks to allocate: `num_blocks` if set, else the byte budget, else kv_cache_fraction's."""
    if config.num_blocks is not None:
        num_blocks = config.num_blocks
    else:
        if config.kv_cache_memory is not None:
            budget = config.kv_cache_memory
        else:
            budget = fraction_budget(config.kv_cache_fraction, device)
        num_blocks = budget // bytes_per_block
    if num_blocks < 1:
        raise ValueError(
            f"the KV cache budget holds no block of {config.block_size} tokens "
            f"({bytes_per_block} bytes each): raise kv_cache_memory, kv_cache_fraction or num_blocks"
        )
    return int(num_blocks)


class KVCache:
    """Per layer one K and one V tensor, shaped as the attention backend wants them.

    One extra block past `num_blocks` is scratch: padded rows (CUDA graphs, padded block tables)
    write and read there, so they never touch a block the block manager hands out. All memory is
    zeroed so a padded read can never see NaN bit patterns (a masked NaN still poisons p @ V).
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        layer_shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_block = num_blocks
        self.dtype = dtype
        self.device = device
        # One allocation for everything: [layer, K/V, *layer_shape].
        self._data = torch.empty((num_layers, 2, *layer_shape), dtype=dtype, device=device)
        self.huge_pages = hugepages.advise(self._data)  # before the first touch (hugepages.py)
        self._data.zero_()
        self.k: list[torch.Tensor] = [self._data[i, 0] for i in range(num_layers)]
        self.v: list[torch.Tensor] = [self._data[i, 1] for i in range(num_layers)]
        per_block = self._data.numel() * self._data.element_size() // (num_blocks + 1)
        self.bytes = per_block * num_blocks  # what the usable blocks cost; scratch not counted

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def summary(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.num_blocks} blocks = {self.num_tokens} tokens ({self.bytes / _GIB:.2f} GiB, {dtype})"


def bytes_per_block(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element
