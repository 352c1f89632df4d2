"""Kernels compiled at start, not in a user's first request (issue 43). On CUDA, Triton compiles each
kernel when it is first launched — seconds for the attention kernels — so without this the first
prefill after every worker start (every scale-up from zero) pays it in its time to first token.
Decode-only batches are compiled by the CUDA graphs' capture; this covers a mixed step and the
eager decode step (graphs off, or past the largest captured size).

The steps run on the cache's scratch block only: no usable block, so no sequence's KV, is touched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from conveyor.engine.sequence import Sequence
from conveyor.engine.step_plan import ScheduledChunk

Execute = Callable[[list[ScheduledChunk]], torch.Tensor]  # ModelRunner.execute

logger = logging.getLogger(__name__)


def warm_kernels(execute: Execute, scratch_block: int, block_size: int, device: torch.device) -> bool:
    """A mixed step (a prefill beside a decode), then a decode alone, on `scratch_block` (the cache's
    one block past the usable ones, kv_cache.py). False, with the reason logged, where that fails:
    the worker still starts, and its first requests compile (or fail) as they would have."""
    length = max(2, min(block_size, 8))

    def chunk(name: str, start: int, n: int) -> ScheduledChunk:
        seq = Sequence(f"warm-up-{name}", [0] * (start + n))
        seq.block_table = [scratch_block]
        return ScheduledChunk(seq, start, n)

    began = time.perf_counter()
    try:
        with torch.inference_mode():
            execute([chunk("decode", length - 1, 1), chunk("prefill", 0, length)])
            execute([chunk("decode", length - 1, 1)])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - the first requests meet the same error, or none
        logger.warning("warming the kernels up failed, so the first requests compile them (%s: %s)",
                       type(exc).__name__, exc)
        return False
    logger.info("kernels warmed up in %.1f s (a mixed step and a decode step)", time.perf_counter() - began)
    return True
