"""The prepared GPU check (issue #18): correctness of the Triton attention path on CUDA, decode and
prefill speed of a Llama-3-8B-shaped model against ceilings measured in the same run.

    bash benchmarks/gpu_check.sh          # the wrapper: time bound, output folder ($OUT if set)
    python -m benchmarks.gpu_check --out DIR  # the same without the bound

Parts: (a) correctness (benchmarks/gpu_correctness.py): a small random Llama's greedy output through
ModelRunner against Hugging Face's, alone vs together, CUDA graphs on vs off, for attention
triton and torch; (b) decode and (c) prefill (benchmarks/gpu_speed.py), CUDA only. Without CUDA, (a)
runs on CPU in fp32 with the Triton kernels under TRITON_INTERPRET=1, and (b), (c) are skipped.
Writes gpu_check.json (every figure, versions, what was skipped and why) and gpu_check.md (the
table), after every part, so a run cut short keeps what it measured.

Needs: torch (a CUDA build for (b), (c)), triton, transformers >= 4.57, numpy; nothing from the
network. The H200 image has all four; elsewhere carry them as wheels.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check_table import table

REPO = Path(__file__).resolve().parents[1]
NEEDS = ("torch", "triton", "transformers", "numpy")
CUDA_TEST = REPO / "tests/engine/test_attention_cuda.py"
_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[gpu_check {time.perf_counter() - _T0:6.1f}s] {msg}", flush=True)


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    for name in NEEDS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out["device"] = props.name
        out["device_memory_bytes"] = props.total_memory
        out["capability"] = f"{props.major}.{props.minor}"
    else:
        out["device"] = f"CPU ({platform.processor() or platform.machine()}), no CUDA"
    return out


def run_part(results: dict[str, Any], name: str, fn: Any, out_dir: Path) -> Any:
    """fn()'s result into results[name]; an exception becomes {"error", "traceback"}, not a crash."""
    log(f"{name}: start")
    try:
        results[name] = fn()
    except Exception as exc:  # noqa: BLE001 - later parts still run, the JSON says what broke
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        log(f"{name}: FAILED {results[name]['error']}")
    write(results, out_dir)
    return results[name]


def skip(results: dict[str, Any], part: str, why: str) -> None:
    results[part] = {"skipped": why}
    results["skipped"][part] = why


def cuda_tests(timeout_s: int) -> dict[str, Any]:
    """The lead's CUDA attention tests, if the file exists. --noconftest: tests/conftest.py needs
    the Redis test servers and sets TRITON_INTERPRET=1, neither of which belongs on a GPU."""
    if not CUDA_TEST.exists():
        return {"skipped": f"{CUDA_TEST.relative_to(REPO)} does not exist"}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", str(CUDA_TEST)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"passed": False, "error": f"timed out after {timeout_s} s"}
    return {
        "passed": proc.returncode == 0,
        "returncode": proc.returncode,
        "tail": (proc.stdout + proc.stderr)[-2000:],
    }


def write(results: dict[str, Any], out_dir: Path) -> None:
    results["wall_s"] = time.perf_counter() - _T0
    (out_dir / "gpu_check.json").write_text(json.dumps(results, indent=1, default=str))
    (out_dir / "gpu_check.md").write_text(table(results))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/gpu-check")
    ap.add_argument("--tiny", action="store_true", help="a tiny correctness model (the test's), few tokens")
    ap.add_argument("--decode-batches", default="1,8,32,128")
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--decode-steps", type=int, default=10, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of graphs on / off, median taken")
    ap.add_argument("--prefill", default="8x2048", help="PROMPTS x LENGTH in one step")
    ap.add_argument("--test-timeout", type=int, default=120)
    ap.add_argument(
        "--smoke-speed", action="store_true", help="without CUDA: (b), (c) on a tiny model (tests)"
    )
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    # Triton reads TRITON_INTERPRET when a kernel is defined, so before any engine import: the
    # interpreter on CPU, never on a GPU (where an inherited TRITON_INTERPRET=1 would time numpy).
    if cuda:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from benchmarks import gpu_correctness

    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"versions": versions(), "argv": sys.argv[1:], "skipped": {}}
    # The engine's own INFO lines (the runner's device, attention backend, KV cache, CUDA graphs).
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stdout)
    log("needs torch (a CUDA build for the speed parts), triton, transformers >= 4.57, numpy")
    log(f"found {results['versions']}")
    missing = [n for n in NEEDS if results["versions"][n] is None]
    if missing:
        results["error"] = (
            f"missing packages {missing}: install them (or bring them as wheels where pip cannot reach)"
        )
    write(results, args.out)  # something to read even if the time bound cuts the first part short
    if args.tiny:
        shape = gpu_correctness.SmallShape(
            hidden=64, layers=2, heads=4, kv_heads=2, vocab=256, prompts=3, new_tokens=4, max_prompt_len=20
        )
    else:  # on CPU Triton's interpreter is slow: short prompts, ~1 min
        shape = gpu_correctness.SmallShape() if cuda else gpu_correctness.SmallShape(max_prompt_len=64)
    device = torch.device("cuda" if cuda else "cpu")
    run_part(
        results, "correctness", lambda: gpu_correctness.run(shape, device, ["triton", "torch"], log), args.out
    )
    if cuda or args.smoke_speed:
        speed(args, results, "cuda" if cuda else "cpu")
    else:
        for part in ("ceilings", "model_8b", "decode", "prefill"):
            skip(results, part, "no CUDA device: decode and prefill speed need a GPU")
    if cuda:
        run_part(results, "cuda_tests", lambda: cuda_tests(args.test_timeout), args.out)
    else:
        skip(results, "cuda_tests", "no CUDA device")
    write(results, args.out)
    print(table(results), flush=True)
    failed = [
        k for k, v in results.items() if isinstance(v, dict) and ("error" in v or v.get("passed") is False)
    ]
    log(f"wrote gpu_check.json and gpu_check.md to {args.out}; failed: {', '.join(failed) or 'none'}")
    return 1 if failed or "error" in results else 0


def speed(args: argparse.Namespace, results: dict[str, Any], device: str) -> None:
    """Parts (b) and (c). device "cpu" only for --smoke-speed: a tiny model, figures meaningless."""
    from benchmarks import gpu_speed

    smoke = device == "cpu"
    results["smoke_speed"] = smoke
    sizes = dict(copy_gib=0.01, matmul_n=128) if smoke else {}
    ceil = run_part(results, "ceilings", lambda: gpu_speed.ceilings(device, **sizes), args.out)
    batches = [int(b) for b in args.decode_batches.split(",")]
    n, length = (int(x) for x in args.prefill.split("x"))
    shape = gpu_speed.SMOKE_SHAPE if smoke else gpu_speed.LLAMA3_8B
    holder: dict[str, Any] = {}

    def build() -> dict[str, Any]:
        blocks = n * -(-length // gpu_speed.BLOCK_SIZE)
        holder["runner"], info = gpu_speed.build_8b(
            max(batches), args.context, tuple(batches), blocks, shape, device
        )
        log(f"model: {info['params'] / 1e9:.2f} B params {info['param_dtypes']}, {info['kv_cache']}")
        return info

    info = run_part(results, "model_8b", build, args.out)
    if "error" in info or "error" in ceil:
        return
    runner = holder.pop("runner")
    steps, rounds = args.decode_steps, args.rounds
    decode = lambda: gpu_speed.decode(runner, info, ceil, batches, args.context, steps, rounds, log)  # noqa: E731
    run_part(results, "decode", decode, args.out)
    run_part(results, "prefill", lambda: gpu_speed.prefill(runner, info, ceil, n, length, 5, log), args.out)


if __name__ == "__main__":
    sys.exit(main())
