"""Runs one step: the scheduled chunks become one flattened batch, one forward, logits for the samplers.

Decode rows (chunks of one token) go first in the batch, prefill chunks after them; every linear
layer sees all rows at once. Each new token's K/V is written in place into the preallocated cache at
slot `block_table[p // block_size] * block_size + p % block_size`, and the lm_head runs only for
the last row of the chunks that sample (and for the prompt rows of requests that ask for prompt
logprobs).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from conveyor.engine import malloc_tuning
from conveyor.engine.attention import AttentionBatch, AttentionGeometry, select_attention
from conveyor.engine.config import EngineConfig
from conveyor.engine.kv_cache import KVCache, bytes_per_block, plan_num_blocks
from conveyor.engine.model.llama import Llama
from conveyor.engine.prompt_logprobs import SLICE_ROWS, score, scored_positions
from conveyor.engine.staging import to_device
from conveyor.engine.step_observer import StepObserver
from conveyor.engine.step_plan import ScheduledChunk
from conveyor.engine.warm_up import warm_kernels

if TYPE_CHECKING:
    from conveyor.engine.attention.cuda import DecodeGraphs

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def resolve_kv_dtype(name: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache's element type for kv_cache_dtype `name` beside the model's `dtype`: auto is
    the model's; bfloat16 below an fp32 model only on CPU, whose kernels widen it as they load."""
    if name == "auto" or _DTYPES.get(name) == dtype:
        return dtype
    if name != "bfloat16":
        raise ValueError(f"kv_cache_dtype must be auto or bfloat16, got {name!r}")
    if device.type != "cpu" or dtype != torch.float32:
        model = str(dtype).removeprefix("torch.")
        raise ValueError(
            f"kv_cache_dtype bfloat16 with a {model} model on {device.type} is not supported: use it on "
            "CPU with the float32 model, or set dtype bfloat16 (the cache follows)"
        )
    return torch.bfloat16


def resolve_gemm_dtype(name: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The GEMM dtype gemm_dtype `name` asks for beside the model's `dtype`: auto is the model's;
    bfloat16 below an fp32 model only on CPU (oneDNN's bfloat16 linear)."""
    if name == "auto" or _DTYPES.get(name) == dtype:
        return dtype
    if name != "bfloat16":
        raise ValueError(f"gemm_dtype must be auto or bfloat16, got {name!r}")
    if device.type != "cpu" or dtype != torch.float32:
        model = str(dtype).removeprefix("torch.")
        raise ValueError(f"gemm_dtype bfloat16 with a {model} model on {device.type} is not supported: "
                         "use it on CPU with the float32 model, or set dtype bfloat16")
    return torch.bfloat16


class ModelRunner:
    """A Llama-family model, its KV cache and its attention backend on one device.

    `ModelRunner(hf_model, config)` takes an instantiated transformers model (its weights are copied,
    q/k/v and gate/up fused); `from_pretrained(path, config)` loads a local HF directory. Exposes
    `num_blocks`, `block_size`, `vocab_size`, `max_model_len`, `device`, `dtype`.
    """

    def __init__(self, hf_model: nn.Module, config: EngineConfig) -> None:
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.block_size = config.block_size
        if self.device.type == "cpu":  # before the weights and the cache are allocated
            malloc_tuning.retain_freed_memory()
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        bf16_gemms = resolve_gemm_dtype(config.gemm_dtype, self.dtype, self.device) != self.dtype
        with torch.no_grad():
            self.model = Llama(hf_model, self.device, self.dtype, bf16_gemms)
        m = self.model
        self.vocab_size = m.vocab_size
        self.max_model_len = m.max_positions  # positions the model was trained for
        self.kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, self.dtype, self.device)
        per_block = bytes_per_block(m.num_layers, self.block_size, m.num_kv_heads, m.head_dim, self.kv_dtype)
        self.num_blocks = plan_num_blocks(config, per_block, self.device)
        geometry = AttentionGeometry(
            num_heads=m.num_heads,
            num_kv_heads=m.num_kv_heads,
            head_dim=m.head_dim,
            block_size=self.block_size,
            num_blocks=self.num_blocks,
            device=self.device,
            dtype=self.dtype,
            kv_dtype=self.kv_dtype,
        )
        self.attention = select_attention(geometry, config.attention)
        self.cache = KVCache(
            m.num_layers,
            self.num_blocks,
            self.block_size,
            self.attention.cache_shape(),
            self.kv_dtype,
            self.device,
        )
        self.observer: StepObserver | None = None  # Engine.observe sets it
        self.graphs: DecodeGraphs | None = None
        if self.device.type == "cuda":  # Triton compiles at first launch: here, not in a request
            warm_kernels(self.execute, self.cache.scratch_block, self.block_size, self.device)
        if self.device.type == "cuda" and self.attention.supports_graphs and m.graph_safe:
            from conveyor.engine.attention.cuda import capture_decode_graphs, graph_sizes

            sizes = graph_sizes(config.max_batch_size, config.cuda_graphs)
            if sizes:
                with torch.inference_mode():  # None where capture fails: eager steps, said why
                    self.graphs = capture_decode_graphs(self._forward, geometry, sizes, m.max_positions)
        logger.info(
            "model runner: %s %s%s, attention %s, KV cache %s, CUDA graphs %s",
            self.device,
            self.dtype,
            f" (GEMMs {self.gemm_dtype_name})" if self.gemm_dtype_name else "",
            self.attention.name,
            self.kv_cache_summary(),
            "on" if self.graphs is not None else "off",
        )

    @property
    def gemm_dtype_name(self) -> str:
        """The layers' GEMM dtype where it is not the model's (gemm_dtype bfloat16), else ''."""
        gemm = self.model.gemm_dtype
        return "" if gemm == self.dtype else str(gemm).removeprefix("torch.")

    @classmethod
    def from_pretrained(cls, path: str | Path, config: EngineConfig) -> ModelRunner:
        """From a local Hugging Face model directory (config.json + safetensors); never downloads."""
        from transformers import AutoModelForCausalLM

        device = resolve_device(config.device)
        hf_model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=resolve_dtype(config.dtype, device), local_files_only=True
        )
        return cls(hf_model, config)

    def kv_cache_summary(self) -> str:
        return self.cache.summary()

    @torch.inference_mode()
    def execute(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        """float32 logits [rows, vocab]: a row per chunk that samples, in chunk order (1 + len(draft)
        rows for a chunk with a draft)."""
        if (observer := self.observer) is None:
            return self._execute(chunks)
        decode_rows = sum(1 + len(c.draft) for c in chunks if c.length == 1)
        prefill_tokens = sum(c.length for c in chunks if c.length != 1)
        observer.batch(decode_rows, prefill_tokens, sum(1 for c in chunks if c.sample))
        observer.start("execute")
        try:
            return self._execute(chunks)
        finally:
            observer.stop("execute")

    def _execute(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        if not chunks:
            return torch.empty(0, self.vocab_size, dtype=torch.float32, device=self.device)
        bs = self.block_size
        # Decode rows first, sorted by the number of KV blocks they read: the torch backend batches
        # only rows of equal width (so that no row's rounding depends on its neighbours), and
        # sorting makes those groups as large as they can be. A decode with a draft is one decode
        # row per position, each seeing the context up to itself: the rows (and bits) the same
        # tokens would get decoded one step at a time (the KV is written before attention reads).
        decode = sorted(
            ((c, j) for c in chunks if c.length == 1 for j in range(1 + len(c.draft))),
            key=lambda row: (row[0].start + row[1]) // bs,
        )
        prefill = [c for c in chunks if c.length != 1]
        order = [c for c, j in decode if j == 0] + prefill
        ids: list[int] = []
        positions: list[int] = []
        slot_parts: list[torch.Tensor] = []
        decode_slots: list[int] = []
        last_row: dict[int, int] = {}  # id(chunk) -> its last row in the batch (a draft's: its first)
        draft_rows: dict[int, list[int]] = {}  # id(chunk) -> the rows of its draft positions
        for c, j in decode:
            if j == 0:
                self._check(c)
                last_row[id(c)] = len(ids)
            else:
                draft_rows.setdefault(id(c), []).append(len(ids))
            p = c.start + j
            ids.append(c.draft[j - 1] if j else c.seq.token_ids[p])
            positions.append(p)
            decode_slots.append(c.seq.block_table[p // bs] * bs + p % bs)
        for c in prefill:
            self._check(c)
            table, end = c.seq.block_table, c.start + c.length
            ids += c.seq.token_ids[c.start : end]
            positions += range(c.start, end)
            blocks = torch.tensor(table[c.start // bs : (end - 1) // bs + 1], dtype=torch.long)
            first = c.start % bs
            slot_parts.append((blocks[:, None] * bs + torch.arange(bs)).view(-1)[first : first + c.length])
            last_row[id(c)] = len(ids) - 1
        # Onto the device through pinned memory (staging.py): no copy here waits for the GPU.
        slots = to_device(torch.cat([torch.tensor(decode_slots, dtype=torch.long), *slot_parts]), torch.long,
                          self.device)  # fmt: skip
        num_decode = len(decode_slots)
        batch = AttentionBatch(
            num_decode=num_decode,
            query_lens=[1] * num_decode + [c.length for c in prefill],
            context_lens=[c.start + j + 1 for c, j in decode] + [c.start + c.length for c in prefill],
            block_tables=[c.seq.block_table for c, _ in decode] + [c.seq.block_table for c in prefill],
            slots=slots,
        )
        meta = self.attention.prepare(batch)
        ids_t = to_device(ids, torch.long, self.device)
        pos_t = to_device(positions, torch.long, self.device)
        hidden = None
        if self.graphs is not None and not prefill:
            hidden = self.graphs.run(ids_t, pos_t, meta)
        if hidden is None:
            hidden = self._forward(ids_t, pos_t, meta)
        self._score_prompts(order, hidden, last_row)
        # A chunk with a draft gets a logits row per position, in position order.
        rows = [r for c in chunks if c.sample for r in (last_row[id(c)], *draft_rows.get(id(c), ()))]
        if not rows:
            return torch.empty(0, self.vocab_size, dtype=torch.float32, device=self.device)
        picked = hidden.index_select(0, to_device(rows, torch.long, self.device))
        return self._logits(picked)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if (observer := self.observer) is None:
            return self.model.logits(hidden)
        observer.start("lm_head")
        try:
            return self.model.logits(hidden)
        finally:
            observer.stop("lm_head")

    def _score_prompts(
        self, order: list[ScheduledChunk], hidden: torch.Tensor, last_row: dict[int, int]
    ) -> None:
        """Fill `prompt_scores` of the chunks whose request asks for prompt logprobs. Done before
        the sampling rows' logits, which may reuse the same buffer."""
        for c in order:
            positions = scored_positions(c.seq, c.start, c.length)
            if not positions:
                continue
            first_row = last_row[id(c)] - c.length + 1 - c.start  # the row of position 0
            k = c.seq.sampling.prompt_logprobs or 0
            for lo in range(positions.start, positions.stop, SLICE_ROWS):
                hi = min(lo + SLICE_ROWS, positions.stop)
                rows = hidden[first_row + lo : first_row + hi]
                c.prompt_scores += score(self._logits(rows), c.seq.token_ids[lo + 1 : hi + 1], k)
    @torch.inference_mode()
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of forked sequences' shared blocks: every layer's K and V of block source
        into block destination, before the forward that writes there."""
        src = to_device([s for s, _ in copies], torch.long, self.device)
        dst = to_device([d for _, d in copies], torch.long, self.device)
        data = self.cache._data  # [layer, K/V, block, ...] for every backend's layout
        data.index_copy_(2, dst, data.index_select(2, src))

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, meta: object) -> torch.Tensor:
        if (observer := self.observer) is None:
            return self.model.forward(ids, positions, meta, self.attention, self.cache.k, self.cache.v)
        observer.start("forward")
        try:
            return self.model.forward(ids, positions, meta, self.attention, self.cache.k, self.cache.v)
        finally:
            observer.stop("forward")

    def _check(self, c: ScheduledChunk) -> None:
        end = c.start + c.length
        room = end + len(c.draft)
        if c.length < 1 or c.start < 0 or end > c.seq.num_tokens:
            raise ValueError(
                f"chunk of {c.seq.request_id!r} [{c.start}, {end}) is outside its {c.seq.num_tokens} tokens"
            )
        if len(c.seq.block_table) * self.block_size < room:
            raise ValueError(
                f"block table of {c.seq.request_id!r} covers {len(c.seq.block_table) * self.block_size} "
                f"positions, the chunk needs {room}"
            )
