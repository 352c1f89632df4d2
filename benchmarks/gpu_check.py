"""The prepared GPU check (issue #18): correctness of the Triton attention path on CUDA, decode and
prefill speed of a Llama-3-8B-shaped model against ceilings measured in the same run.

    bash benchmarks/gpu_check.sh          # the wrapper: time bound, output folder ($OUT if set)
    python -m benchmarks.gpu_check --out DIR  # the same without the bound

Parts: (a) correctness (benchmarks/gpu_correctness.py): a small random Llama's greedy output through
ModelRunner against Hugging Face's, for attention triton and torch; the prompts alone and with
graphs off are judged against HF the same way (in bf16 a row's rounding may follow its batch), their
exact equality with the batched run only reported; (b) decode (graph and eager step times, host
syncs per step; then the kernel table of one eager step at batch 32, benchmarks/gpu_profile.py) and
(c) prefill (benchmarks/gpu_speed.py), CUDA only. Without CUDA, (a) runs on CPU
in fp32 with the Triton kernels under TRITON_INTERPRET=1, and (b), (c) are skipped. Each part has
its own time bound (BUDGET_S, --budget PART=SECONDS) and fallback: a part that fails or runs past
its bound records its error (a cut decode part keeps the rows it measured) and the next one runs;
when the 8B model's graphs cannot be captured, decode still reports its eager step times.
Writes gpu_check.json (every figure, versions, what was skipped and why) and gpu_check.md (the
table), after every part and every decode batch, so a run cut short keeps what it measured.

Needs: torch (a CUDA build for (b), (c)), triton, transformers >= 4.57, numpy; nothing from the
network. The H200 image has all four; elsewhere carry them as wheels.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.metadata
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check_table import table

REPO = Path(__file__).resolve().parents[1]
NEEDS = ("torch", "triton", "transformers", "numpy")
CUDA_TEST = REPO / "tests/engine/test_attention_cuda.py"
_T0 = time.perf_counter()
# Each part's own time bound (seconds); together the wrapper's 480 s. The correctness part runs
# eight small runs per backend; decode, 8 timed rounds per batch size.
BUDGET_S = dict(correctness=120, ceilings=30, model_8b=90, decode=110, kernels=15, prefill=40, cuda_tests=75)


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


class PartTimeout(BaseException):
    """A part ran past its own budget (--budget); the parts after it still run. A BaseException, as
    KeyboardInterrupt, so that the `except Exception` of a library (or of a part's own fallbacks)
    cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """PartTimeout in the main thread after `seconds`, by SIGALRM, and again every second after
    that until the part ends. Python code stops at once; a call into C (a kernel launch, a
    synchronize) first returns, so the wrapper's overall bound stays."""

    armed = [True]

    def expire(signum: int, frame: Any) -> None:
        if armed[0]:
            raise PartTimeout(f"ran past its {seconds:g} s budget")

    previous = signal.signal(signal.SIGALRM, expire)
    start = time.monotonic()
    outer_left, outer_every = signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        # Disarmed before the timer stops: a tick landing here would otherwise leave this part's
        # timer and handler running and cut the next parts.
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left:  # an enclosing timer (pytest-timeout's) goes on with what it had left
            left = max(outer_left - (time.monotonic() - start), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, outer_every)


def run_part(results: dict[str, Any], name: str, fn: Any, out_dir: Path, budget_s: float,
             partial: list[Any] | None = None) -> Any:  # fmt: skip
    """fn()'s result into results[name], within budget_s; an exception or the budget's end becomes
    {"error", "traceback"} (with what `partial` collected so far under "rows"), not a crash."""
    log(f"{name}: start (budget {budget_s:g} s)")
    try:
        with deadline(budget_s):
            results[name] = fn()
    except (Exception, PartTimeout) as exc:  # noqa: BLE001 - later parts still run, the JSON says what broke
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        if isinstance(exc, PartTimeout):
            results[name]["timed_out"] = True
        if partial:
            results[name]["rows"] = partial
        log(f"{name}: FAILED {results[name]['error']}")
    write(results, out_dir)
    return results[name]


def preload() -> None:
    """The imports the parts make, before any part's budget runs: a budget that ends inside an import
    leaves the module half-made, and every later part's import of it fails (ModuleNotFoundError for
    transformers' lazily imported LlamaForCausalLM, seen in CI when the correctness part was cut)."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401

    from benchmarks import gpu_profile, gpu_speed  # noqa: F401


def budgets(given: list[str]) -> dict[str, float]:
    """BUDGET_S with the --budget PART=SECONDS overrides."""
    out = dict(BUDGET_S)
    for item in given:
        part, _, seconds = item.partition("=")
        if part not in out:
            raise SystemExit(f"--budget {item}: parts are {', '.join(out)}")
        out[part] = float(seconds)
    return out


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
    ap.add_argument(
        "--budget", action="append", default=[], metavar="PART=SECONDS",
        help=f"a part's own time bound, repeatable (defaults {BUDGET_S})",
    )  # fmt: skip
    ap.add_argument(
        "--smoke-speed", action="store_true", help="without CUDA: (b), (c) on a tiny model (tests)"
    )
    args = ap.parse_args(argv)
    args.budget = budgets(args.budget)
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
    if not missing:
        preload()
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
    correctness = lambda: gpu_correctness.run(shape, device, ["triton", "torch"], log)  # noqa: E731
    run_part(results, "correctness", correctness, args.out, args.budget["correctness"])
    if cuda or args.smoke_speed:
        speed(args, results, "cuda" if cuda else "cpu")
    else:
        for part in ("ceilings", "model_8b", "decode", "kernels", "prefill"):
            skip(results, part, "no CUDA device: decode and prefill speed need a GPU")
    if cuda:
        budget = args.budget["cuda_tests"]
        run_part(results, "cuda_tests", lambda: cuda_tests(int(budget) - 5), args.out, budget)
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
    from benchmarks import gpu_profile, gpu_speed

    smoke = device == "cpu"
    results["smoke_speed"] = smoke
    sizes = dict(copy_gib=0.01, matmul_n=128) if smoke else {}
    ceilings = functools.partial(gpu_speed.ceilings, device, **sizes)
    ceil = run_part(results, "ceilings", ceilings, args.out, args.budget["ceilings"])
    batches = [int(b) for b in args.decode_batches.split(",")]
    n, length = (int(x) for x in args.prefill.split("x"))
    shape = gpu_speed.SMOKE_SHAPE if smoke else gpu_speed.LLAMA3_8B
    holder: dict[str, Any] = {}

    def build() -> dict[str, Any]:
        blocks = n * -(-length // gpu_speed.BLOCK_SIZE)
        make = functools.partial(gpu_speed.build_8b, max(batches), args.context, min_blocks=blocks,
                                 shape=shape, device=device)  # fmt: skip
        try:
            holder["runner"], info = make(tuple(batches))
        except Exception as exc:  # noqa: BLE001 - eager step times are still worth having
            log(f"model: building with CUDA graphs failed ({type(exc).__name__}: {exc}); again without")
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
            holder["runner"], info = make(())
            info["graphs_missing"] = f"building the runner with graphs failed: {type(exc).__name__}: {exc}"
        log(f"model: {info['params'] / 1e9:.2f} B params {info['param_dtypes']}, {info['kv_cache']}, "
            f"graphs {info['graph_sizes'] or info['graphs_missing']}")  # fmt: skip
        return info

    info = run_part(results, "model_8b", build, args.out, args.budget["model_8b"])
    if "error" in info or "error" in ceil:
        return
    runner = holder.pop("runner")
    steps, rounds = args.decode_steps, args.rounds
    rows: list[dict[str, Any]] = []
    on_row = lambda: write({**results, "decode": rows}, args.out)  # noqa: E731 - a cut keeps its rows
    decode = functools.partial(
        gpu_speed.decode, runner, info, ceil, batches, args.context, steps, rounds, log, rows, on_row
    )
    run_part(results, "decode", decode, args.out, args.budget["decode"], partial=rows)
    kernels = functools.partial(gpu_profile.kernel_table, runner, 32 if 32 in batches else max(batches),
                                args.context, log)  # fmt: skip
    run_part(results, "kernels", kernels, args.out, args.budget["kernels"])
    prefill = functools.partial(gpu_speed.prefill, runner, info, ceil, n, length, 5, log)
    run_part(results, "prefill", prefill, args.out, args.budget["prefill"])


if __name__ == "__main__":
    sys.exit(main())
