"""The simulated engine's step time: what one forward of a batch would take on a GPU.

A decode step of an LLM is bound by memory: every step reads all the weights once and each row
reads the K/V of its context; a prefill chunk is bound by compute, about 2 FLOPs per parameter per
token. So

    t_step = fixed + weight_bytes / bandwidth + kv_bytes_per_token × context / bandwidth
             + prefill_tokens × prefill_flops_per_token / flops

with `context` the K/V positions the step's rows attend over (each chunk's start + length) and
`bandwidth`, `flops` the achieved (not peak) rates. The defaults are an 8B Llama-3-class model in
bfloat16 on one H200; docs/operations/simulated-engine.md derives them and says how to replace
them with a GPU's measured figures. Summing the memory and compute terms (instead of taking the
larger) overestimates a step mixing a large prefill with decodes, slightly: a conservative plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from conveyor.engine.config import DEFAULT_KV_CACHE_FRACTION
from conveyor.engine.step_plan import ScheduledChunk

GB = 1e9


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    fixed_s: float = 0.0015  # launches, sampling, host work per step (CUDA graphs on)
    weight_bytes: float = 16.06 * GB  # 8.03e9 parameters × 2 bytes (bfloat16)
    kv_bytes_per_token: float = 131_072  # 32 layers × 8 KV heads × 128 dims × (K, V) × 2 bytes
    memory_bandwidth: float = 3120 * GB  # bytes/s: 65 % of an H200's 4.8 TB/s
    prefill_flops_per_token: float = 16.06 * GB  # 2 × parameters
    flops: float = 545e12  # FLOP/s: 55 % of an H200's 989 TFLOPS dense bfloat16
    gpu_memory_bytes: float = 141 * GB  # an H200's HBM: the KV cache's room is what the weights leave

    def __post_init__(self) -> None:
        for name in ("memory_bandwidth", "flops", "kv_bytes_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"the simulated {name} must be positive, got {getattr(self, name)}")
        for name in ("fixed_s", "weight_bytes", "prefill_flops_per_token"):
            if getattr(self, name) < 0:
                raise ValueError(f"the simulated {name} must not be negative, got {getattr(self, name)}")

    def seconds(self, context_tokens: int, prefill_tokens: int) -> float:
        """One step that attends over `context_tokens` K/V positions in all and prefills `prefill_tokens`."""
        read = self.weight_bytes + self.kv_bytes_per_token * context_tokens
        compute = prefill_tokens * self.prefill_flops_per_token
        return self.fixed_s + read / self.memory_bandwidth + compute / self.flops

    def step_seconds(self, chunks: Iterable[ScheduledChunk]) -> float:
        """The step of these chunks: a chunk longer than one token, or a sequence's first, is prefill."""
        context = prefill = 0
        for c in chunks:
            context += c.start + c.length
            if c.length > 1 or c.seq.num_generated == 0:
                prefill += c.length
        return self.seconds(context, prefill)

    def kv_budget_bytes(self, fraction: float | None) -> int:
        """The KV cache under kv_cache_fraction `fraction` as the real engine reads it on CUDA
        (vLLM's gpu_memory_utilization): `fraction` of the GPU's memory less the weights; None: 0.9."""
        if fraction is None:
            fraction = DEFAULT_KV_CACHE_FRACTION["cuda"]
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"kv_cache_fraction must be in (0, 1], got {fraction}")
        budget = self.gpu_memory_bytes * fraction - self.weight_bytes
        if budget <= 0:
            raise ValueError(f"the simulated weights ({self.weight_bytes:.3g} B) fill kv_cache_fraction "
                             f"{fraction} of the simulated GPU memory ({self.gpu_memory_bytes:.3g} B): "
                             "raise sim_gpu_memory_gb or kv_cache_fraction")
        return int(budget)
