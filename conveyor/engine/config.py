"""Engine limits and cache geometry. Field names follow TGI's launcher where TGI has one."""

from __future__ import annotations

from dataclasses import dataclass

# kv_cache_fraction where none is set: vLLM's gpu_memory_utilization on CUDA (and in the simulated
# engine, which models a GPU); on CPU a share of the available RAM, which the host's other processes
# and the activations share.
DEFAULT_KV_CACHE_FRACTION = {"cuda": 0.9, "cpu": 0.3}


@dataclass(slots=True)
class EngineConfig:
    block_size: int = 16
    # Tokens of prefill (prompt chunks) one step may process. vLLM's server's 2048 (TGI: 4096): a
    # request that arrives mid-step waits for the step's end, so shorter steps start it sooner.
    max_batch_prefill_tokens: int = 2048
    # Sum of the context lengths (prompt + generated) of all sequences in the batch; None: bounded
    # only by the KV blocks.
    max_batch_total_tokens: int | None = None
    max_batch_size: int = 256  # running sequences at most
    # Order of waiting requests of one priority: "shortest" (least prefill first, a request passed
    # only until as many prefill tokens as its own have been served after it arrived) or "arrival".
    admission_order: str = "shortest"
    enable_prefix_caching: bool = True
    # KV cache budget in bytes; None: from `kv_cache_fraction`.
    kv_cache_memory: int | None = None
    # On CUDA, vLLM's gpu_memory_utilization: the share of the GPU's total memory the worker may
    # fill, weights and whatever else is in use counted; the KV cache gets fraction × total − in use
    # after the weights are loaded, the rest is left to activations and CUDA graphs. On CPU, the
    # share of the RAM available then (RAM is the host's, shared). None: 0.9 on CUDA (vLLM's
    # default), 0.3 on CPU (DEFAULT_KV_CACHE_FRACTION).
    kv_cache_fraction: float | None = None
    num_blocks: int | None = None  # overrides the memory budget (tests)
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    # The KV cache's element type (TGI's --kv-cache-dtype): auto, the model's dtype, or bfloat16,
    # which halves the bytes decode attention streams and doubles the blocks a budget holds; the
    # CPU kernels widen it to fp32 as they load it.
    kv_cache_dtype: str = "auto"
    device: str = "auto"  # auto: cuda when available, else cpu
    # auto, flash-attn, triton or torch: conveyor/engine/attention/__init__.py's select_attention
    # (on CPU, auto is the C++ kernels where they are built; torch never uses them).
    attention: str = "auto"
    # The layers' GEMMs: auto, the model's dtype; bfloat16 (a float32 model on CPU with AVX512_BF16
    # or AMX) ~1.6x faster, with outputs no longer bit-equal to HF fp32's (the lm_head stays fp32).
    gemm_dtype: str = "auto"
    # Batch sizes of the pure-decode CUDA graphs (TGI's --cuda-graphs); None: 1, 2, 4, 8, then
    # every 16 up to max_batch_size; (): no graphs.
    cuda_graphs: tuple[int, ...] | None = None
    # Speculative decoding by prompt lookup (conveyor/engine/speculative/): draft tokens per decode
    # (TGI's --speculate; vLLM's num_speculative_tokens), 0: off; the n-gram lengths matched
    # (vLLM's prompt_lookup_min / prompt_lookup_max).
    speculate: int = 0
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
