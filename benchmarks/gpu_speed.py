"""benchmarks/gpu_check.py's parts (b) and (c): the device's ceilings, then decode and prefill of a
Llama-3-8B-shaped model with random bf16 weights, against those ceilings. On CUDA; on CPU only
as --smoke-speed (a tiny model, for the tests).

- Ceilings, measured here: memory bandwidth from a device-to-device copy (bytes read + written),
  bf16 matmul peak from an n x n x n product.
- Decode: every sequence holds `context` tokens (block tables filled directly, the cache filled
  with small random values: no prefill needed, the KV content does not change the speed); one
  step re-runs the token at position `context`, so every step reads the same context. Bytes per
  step = weights (every parameter, the embedding table included, as issue #18 counts them: 16.06
  GB) + KV bytes per token x (context + 1) x batch; the roofline step time is that over the
  measured bandwidth. A step is the engine's whole `execute` (metadata, forward, lm_head). CUDA
  graphs on, and off (runner.graphs = None) in the same runner; when no graphs were captured (a
  failed capture leaves the runner eager) the eager step times are still measured, and the graphs'
  entry gives the capture's logged reason. Host syncs per step of each mode are counted on CUDA
  with torch.cuda.set_sync_debug_mode("warn") over a few untimed steps (one warning per sync,
  with the Python line that made it).
- Prefill: `prompts` x `prompt_len` tokens in one execute. FLOPs = 2 x linear weights x tokens
  + 2 x vocab x hidden x rows that sample (the lm_head runs for the last row of each prompt only)
  + attention 4 x layers x heads x head_dim x sum over rows of the keys each row sees (causal:
  row p sees p + 1 keys), against the measured matmul peak.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import logging
import random
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from conveyor.engine.config import EngineConfig
from conveyor.engine.model_runner import ModelRunner
from conveyor.engine.sequence import Sequence
from conveyor.engine.step_plan import ScheduledChunk

GIB = 1024**3
LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)
# The CPU smoke run's model (tests): every code path of the real one, in seconds.
SMOKE_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
BLOCK_SIZE = 16


def timed(fn: Callable[[], object], reps: int, warmup: int = 3) -> float:
    """Seconds per call over `reps` calls after `warmup` calls: CUDA events on CUDA (the CPU smoke
    run, --smoke-speed, uses perf_counter)."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def _copy_s(n: int, device: str) -> float:
    src = torch.empty(n, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    return timed(lambda: dst.copy_(src), reps=10)


def _matmul_s(n: int, device: str) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    return timed(lambda: a @ b, reps=10)


def ceilings(device: str = "cuda", copy_gib: float = 4.0, matmul_n: int = 8192) -> dict[str, float]:
    n = int(copy_gib * GIB) // 2  # bf16 elements
    copy_s, mm_s = _copy_s(n, device), _matmul_s(matmul_n, device)
    if device == "cuda":
        torch.cuda.empty_cache()
    return {
        "copy_bytes": n * 2,
        "bandwidth_bytes_per_s": 2 * n * 2 / copy_s,  # read + written
        "matmul_n": matmul_n,
        "bf16_matmul_flops_per_s": 2 * matmul_n**3 / mm_s,
    }


def build_8b(
    max_batch: int,
    context: int,
    graphs: tuple[int, ...],
    min_blocks: int = 0,
    shape: dict[str, Any] = LLAMA3_8B,
    device: str = "cuda",
) -> tuple[ModelRunner, dict[str, Any]]:
    """The runner over random weights made on the device (never 8B on the CPU): bf16 on CUDA,
    fp32 on CPU (the smoke run; Triton's interpreter gets bf16 dots wrong)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            hf = LlamaForCausalLM(LlamaConfig(**shape)).eval()
    finally:
        torch.set_default_dtype(previous)
    params = sum(p.numel() for p in hf.parameters())
    dtypes = sorted({str(p.dtype) for p in hf.parameters()})
    per_seq = -(-(context + 1) // BLOCK_SIZE)
    engine_config = EngineConfig(
        block_size=BLOCK_SIZE,
        num_blocks=max(max_batch * per_seq, min_blocks) + 8,
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        attention="triton",
        max_batch_size=max_batch,
        cuda_graphs=graphs,
    )
    with _warnings_of("conveyor.engine.attention.cuda") as capture_warnings:
        runner = ModelRunner(hf, engine_config)
    del hf
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    runner.cache._data.normal_(0, 0.02)  # as if prefilled; small values: no overflow, no NaN
    m = runner.model
    info = {
        "params": params,
        "param_dtypes": dtypes,
        "weight_bytes": params * m.embed.element_size(),
        "kv_bytes_per_token": 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.embed.element_size(),
        "attention": runner.attention.name,
        "graph_sizes": list(runner.graphs.sizes) if runner.graphs else [],
        "graphs_missing": None if runner.graphs else _why_no_graphs(device, graphs, capture_warnings),
        "kv_cache": runner.kv_cache_summary(),
        "linear_params": sum(
            w.numel()
            for layer in m.layers
            for w in (layer.qkv.weight, layer.o.weight, layer.gate_up.weight, layer.down.weight)
        ),
    }
    return runner, info


@contextlib.contextmanager
def _warnings_of(name: str) -> Iterator[list[str]]:
    """The messages logger `name` warns with inside the block (a failed graph capture says why)."""
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger(name).addHandler(handler)
    try:
        yield seen
    finally:
        logging.getLogger(name).removeHandler(handler)


def _why_no_graphs(device: str, sizes: tuple[int, ...], warned: list[str]) -> str:
    if device != "cuda":
        return "no CUDA device: no graphs to capture"
    if not sizes:
        return "no graph sizes asked for"
    return "; ".join(warned) or "CUDA graph capture failed (see gpu_check.log)"


def _sequences(runner: ModelRunner, n: int, length: int, seed: int) -> list[Sequence]:
    """n sequences of random tokens on block tables drawn from the shuffled cache."""
    rng = random.Random(seed)
    free = list(range(runner.num_blocks))
    rng.shuffle(free)
    seqs = []
    for i in range(n):
        seq = Sequence(f"s{i}", [rng.randrange(runner.vocab_size) for _ in range(length)])
        seq.block_table = [free.pop() for _ in range(-(-length // runner.block_size))]
        seqs.append(seq)
    return seqs


def host_syncs(step: Callable[[], object], steps: int = 3) -> dict[str, Any]:
    """Host syncs per step, counted on CUDA by torch's sync debug mode ("warn": one warning per
    synchronizing call, attributed to the Python line that made it), and the lines that made them."""
    if not torch.cuda.is_available():
        return {"host_syncs_per_step": None, "host_syncs_why": "CUDA only (torch.cuda.set_sync_debug_mode)"}
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in seen if "synchroniz" in str(w.message)]
    where = collections.Counter(f"{w.filename}:{w.lineno}" for w in syncs)
    return {
        "host_syncs_per_step": len(syncs) / steps,
        "host_sync_lines": {line: n / steps for line, n in where.most_common()},
    }


def decode(
    runner: ModelRunner,
    info: dict[str, Any],
    ceil: dict[str, float],
    batches: list[int],
    context: int,
    steps: int,
    rounds: int,
    log: Callable[[str], None],
    rows: list[dict[str, Any]] | None = None,
    on_row: Callable[[], None] = lambda: None,
) -> list[dict[str, Any]]:
    """One row per batch size, appended to `rows` as it is measured (on_row after each, so a part
    cut short keeps its rows). Graphs and eager in the same runner; without graphs (none captured:
    a failed capture, or CPU) the eager figures still come, and the graphs' entry says why not. A
    mode that fails at one batch records its error and the other mode still runs."""
    rows = [] if rows is None else rows
    graphs = runner.graphs
    modes = ["graphs", "eager"] if graphs is not None else ["eager"]
    for batch in batches:
        seqs = _sequences(runner, batch, context + 1, seed=batch)
        chunks = [ScheduledChunk(s, context, 1) for s in seqs]
        step = functools.partial(runner.execute, chunks)
        kv_bytes = info["kv_bytes_per_token"] * (context + 1) * batch
        roof_s = (info["weight_bytes"] + kv_bytes) / ceil["bandwidth_bytes_per_s"]
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        errors: dict[str, str] = {}
        for _ in range(rounds):  # on and off interleaved, so drift hits both alike
            for mode in modes:
                if mode in errors:
                    continue
                runner.graphs = graphs if mode == "graphs" else None
                try:
                    times[mode].append(timed(step, reps=steps))
                except Exception as exc:  # noqa: BLE001 - the other mode's figures still count
                    errors[mode] = f"{type(exc).__name__}: {exc}"
                finally:
                    runner.graphs = graphs
        row: dict[str, Any] = {
            "batch": batch,
            "context": context + 1,
            "bytes_per_step": info["weight_bytes"] + kv_bytes,
            "roofline_step_s": roof_s,
            "roofline_tokens_per_s": batch / roof_s,
        }
        if graphs is None:
            row["graphs"] = {"skipped": info.get("graphs_missing", "no CUDA graphs captured")}
        for mode in modes:
            if mode in errors:
                row[mode] = {"error": errors[mode]}
                continue
            runner.graphs = graphs if mode == "graphs" else None
            try:
                syncs = host_syncs(step)
            except Exception as exc:  # noqa: BLE001 - the step times stand without the count
                syncs = {"host_syncs_per_step": None, "host_syncs_why": f"{type(exc).__name__}: {exc}"}
            finally:
                runner.graphs = graphs
            s = statistics.median(times[mode])
            row[mode] = {
                "step_s": s,
                "step_s_all": times[mode],
                "tokens_per_s": batch / s,
                "roofline_share": roof_s / s,
                **syncs,
            }
        briefs = [_mode_brief(mode, row[mode]) for mode in ("graphs", "eager")]
        log(f"decode batch {batch}: {'; '.join(briefs)}; roofline {row['roofline_tokens_per_s']:,.0f} tok/s")
        rows.append(row)
        on_row()
    return rows


def _mode_brief(mode: str, m: dict[str, Any]) -> str:
    if "step_s" not in m:
        return f"{mode} {m.get('skipped') or m.get('error')}"
    syncs = m["host_syncs_per_step"]
    return (
        f"{mode} {m['tokens_per_s']:,.0f} tok/s ({m['roofline_share']:.0%} of roofline"
        + ("" if syncs is None else f", {syncs:g} host syncs/step")
        + ")"
    )


def prefill_flops(info: dict[str, Any], m: Any, prompts: int, length: int) -> float:
    linear = 2 * info["linear_params"] * prompts * length
    lm_head = 2 * m.vocab_size * m.hidden_size * prompts
    keys_seen = prompts * length * (length + 1) // 2  # causal: row p sees p + 1 keys
    attention = 4 * m.num_layers * m.num_heads * m.head_dim * keys_seen
    return float(linear + lm_head + attention)


def prefill(
    runner: ModelRunner,
    info: dict[str, Any],
    ceil: dict[str, float],
    prompts: int,
    length: int,
    reps: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    seqs = _sequences(runner, prompts, length, seed=1)
    chunks = [ScheduledChunk(s, 0, length) for s in seqs]
    s = timed(lambda: runner.execute(chunks), reps=reps, warmup=2)
    flops = prefill_flops(info, runner.model, prompts, length)
    out = {
        "prompts": prompts,
        "prompt_len": length,
        "step_s": s,
        "tokens_per_s": prompts * length / s,
        "flops": flops,
        "flops_per_s": flops / s,
        "peak_share": flops / s / ceil["bf16_matmul_flops_per_s"],
    }
    log(
        f"prefill {prompts} x {length}: {out['tokens_per_s']:,.0f} tok/s, "
        f"{out['flops_per_s'] / 1e12:.0f} TFLOP/s = {out['peak_share']:.0%} of the measured bf16 peak"
    )
    return out
