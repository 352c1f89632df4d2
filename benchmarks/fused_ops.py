"""The Llama forward's elementwise ops, torch path vs conveyor/engine/model/fused_ops.cpp, A-B in one process.

    .venv/bin/python benchmarks/fused_ops.py                     # 64, 512, 4096 rows, 2 threads
    .venv/bin/python benchmarks/fused_ops.py --rows 64,512 --repeat 21

Builds the default model's conveyor/engine/model/llama.py Llama (fp32) and times its own methods on random
inputs of the model's shapes: _rms_norm (the five-op norm vs fused_ops.cpp's rms_norm; F.rms_norm,
what the fused path used before 2026-12-03, is timed beside them), _rope (cat + mul_ +
addcmul vs one fused pass over q and k) and _act_mul (silu on the strided gate half, then the
multiply, vs one fused pass), switching the model between the two paths (its `fused` and
`fused_norm` attributes, what CONVEYOR_CPU_FUSED=torch sets) inside each repeat, so that both legs
see the same machine load. Prints per-op µs per call (best repeat), the torch/fused ratio of each
A-B pair (median and range over repeats) and the per-step total of these ops over all layers
(2 norms, 1 RoPE, 1 activation per layer).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.engine.loader import resolve_model  # noqa: E402
from conveyor.engine.model import fused_ops  # noqa: E402
from conveyor.engine.model.llama import Llama  # noqa: E402

LEGS = ("torch", "fused")


def set_path(model: Llama, leg: str, module: object) -> None:
    model.fused = module if leg == "fused" else None  # type: ignore[assignment]
    model.fused_norm = leg == "fused"  # with the module: its rms_norm, at model.norm_lanes


def per_call(fn: Callable[[], object], calls: int) -> float:
    fn()  # warm: buffers allocated, caches filled
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def bench_rows(model: Llama, module: object, rows: int, repeat: int, g: torch.Generator) -> None:
    layer = model.layers[0]
    h = torch.randn(rows, model.hidden_size, generator=g)
    qkv = torch.randn(rows, layer.qkv.out_features, generator=g)
    gate_up = torch.randn(rows, 2 * model.intermediate_size, generator=g) * 3
    cos, sin = (t.reshape(rows, -1) for t in model.rope(torch.randint(0, 2048, (rows,), generator=g)))
    qk = torch.empty(rows, model.num_heads + model.num_kv_heads, model.head_dim)
    ops: dict[str, tuple[Callable[[], object], int]] = {  # op: (one call, calls per layer)
        "rms_norm": (lambda: model._rms_norm(h, layer.input_norm), 2),
        "rope (q and k)": (lambda: model._rope(qkv, cos, sin, qk), 1),
        "silu(gate) * up": (lambda: model._act_mul(gate_up), 1),
    }
    calls = max(3, 20000 // rows)
    step = dict.fromkeys(LEGS, 0.0)
    for name, (fn, per_layer) in ops.items():
        times: dict[str, list[float]] = {leg: [] for leg in LEGS}
        for _ in range(repeat):
            for leg in LEGS:
                set_path(model, leg, module)
                times[leg].append(per_call(fn, calls))
        ratios = [a / b for a, b in zip(times["torch"], times["fused"], strict=True)]
        best = {leg: min(t) for leg, t in times.items()}  # the least disturbed repeat
        for leg in LEGS:
            step[leg] += best[leg] * per_layer * model.num_layers
        print(f"| {rows} | {name} | {1e6 * best['torch']:.1f} | {1e6 * best['fused']:.1f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    weight = layer.input_norm
    def f_norm() -> torch.Tensor:
        return F.rms_norm(h, weight.shape, weight, model.eps)

    f_rms_norm = min(per_call(f_norm, calls) for _ in range(repeat))
    print(f"| {rows} | rms_norm as F.rms_norm | {1e6 * f_rms_norm:.1f} | | |")
    print(f"| {rows} | all layers, per step | {1e3 * step['torch']:.2f} ms | "
          f"{1e3 * step['fused']:.2f} ms | {step['torch'] / step['fused']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="64,512,4096")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=11, help="A-B pairs per op and row count")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    module = fused_ops.load()
    if module is None:
        sys.exit("the fused ops could not be built (see the warning above), or CONVEYOR_CPU_FUSED=torch")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(resolve_model(None).path, dtype=torch.float32)
    model = Llama(hf, torch.device("cpu"), torch.float32)
    print(f"{model.num_layers} layers, hidden {model.hidden_size}, heads {model.num_heads}+"
          f"{model.num_kv_heads}x{model.head_dim}, intermediate {model.intermediate_size}; "
          f"{args.threads} threads, {args.repeat} A-B repeats\n")
    print("| rows | op | torch µs | fused µs | torch / fused (range) |")
    print("|---:|---|---:|---:|---|")
    g = torch.Generator().manual_seed(0)
    for rows in (int(r) for r in args.rows.split(",")):
        bench_rows(model, module, rows, args.repeat, g)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
