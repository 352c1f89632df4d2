"""Conveyor side by side with its peers, in one sitting, on this machine: the same workload with
the same client (`conveyor bench`'s) against
  (1) Conveyor, full stack (`conveyor serve`, default model, prefix caching off),
  (2) vLLM's CPU build serving the same converted weights (its venv from ../shared/peers/setup-vllm.sh),
  (3) Hugging Face `generate` behind bench/hf_server.py (the naive baseline),
then vLLM's own client (`vllm bench serve`) against (1) and (2), Conveyor with SSE keep-alives off
(`--sse-keepalive-s 0`: that client jams on a lone SSE comment). Prints one table with each
system's figures and their ratios to Conveyor's; a peer that cannot run is named, with why.

    .venv/bin/python bench/peers.py                             # 64 x 256 random tokens in, 128 out, rate inf
    .venv/bin/python bench/peers.py --request-rate 4 --systems conveyor,vllm
    .venv/bin/python bench/peers.py --out bench/results/peer     # JSON per run + plots + table.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.loadgen import plots  # noqa: E402
from bench.loadgen.options import Options  # noqa: E402
from bench.loadgen.report import public, table  # noqa: E402
from bench.loadgen.run import RunConfig, run  # noqa: E402
from bench.loadgen.workloads import HFTokenizer, random_workload  # noqa: E402

SYSTEMS = ("conveyor", "vllm", "hf")
SERVED = "smollm2-135m"
# ../shared/peers beside the checkout (a worktree's sits one level further down).
PEERS_DIR = next((d for d in (REPO.parent / "shared" / "peers", REPO.parents[1] / "shared" / "peers")
                  if d.is_dir()), REPO.parent / "shared" / "peers")


class PeerUnavailable(Exception):
    """A peer that cannot run here, with why."""


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerUnavailable(f"it exited with {proc.returncode} before it was ready: see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=5).status_code == 200:
                return
        time.sleep(1)
    raise PeerUnavailable(f"not ready after {timeout_s:.0f} s: see {log}")


@contextlib.contextmanager
def server(cmd: list[str], ready_url: str, log: Path, env: dict[str, str] | None = None,
           timeout_s: float = 600) -> Iterator[None]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env={**os.environ, **(env or {})}, cwd=REPO,
                                start_new_session=True)  # its own group: stopping it stops its children
    try:
        wait_ready(ready_url, proc, timeout_s, log)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def vllm_client(venv: Path, port: int, model_dir: Path, args: argparse.Namespace,
                out: Path) -> dict[str, Any]:
    """`vllm bench serve` on the same workload; its result JSON, in our key names."""
    name = f"vllm-client-{port}.json"
    cmd = [str(venv / "bin" / "vllm"), "bench", "serve", "--backend", "openai",
           "--endpoint", "/v1/completions",
           "--base-url", f"http://127.0.0.1:{port}", "--model", str(model_dir), "--tokenizer", str(model_dir),
           "--served-model-name", SERVED, "--dataset-name", "random", "--random-input-len",
           str(args.input_len),
           "--random-output-len", str(args.output_len), "--random-range-ratio", "0",
           "--num-prompts", str(args.num_prompts), "--ignore-eos", "--request-rate", str(args.request_rate),
           "--seed", str(args.seed), "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,90,99", "--save-result", "--result-dir", str(out),
           "--result-filename", name]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ,
                          "VLLM_TARGET_DEVICE": "cpu"})
    (out / f"vllm-client-{port}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not (out / name).exists():
        raise PeerUnavailable(f"vllm bench serve failed ({done.returncode}): "
                              f"see {out}/vllm-client-{port}.log")
    r = json.loads((out / name).read_text())
    dist = {m: {"mean": r.get(f"mean_{m}_ms"), "p50": r.get(f"p50_{m}_ms", r.get(f"median_{m}_ms")),
                "p90": r.get(f"p90_{m}_ms"), "p99": r.get(f"p99_{m}_ms")}
            for m in ("ttft", "tpot", "itl", "e2el")}
    return {"completed": r["completed"], "failed": r.get("failed", 0), "errors": {},
            "total_token_throughput": r["total_token_throughput"],
            "output_throughput": r["output_throughput"],
            **{f"{m}_ms": d for m, d in dist.items()}}


def measure(name: str, port: int, requests: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    opts = Options(base_url=f"http://127.0.0.1:{port}", model=SERVED)
    warm = RunConfig(progress=False)
    run(requests[:4], opts, warm)
    summary = run(requests, opts, RunConfig(rate=args.request_rate, seed=args.seed, progress=not args.quiet))
    print(table(summary, f"{name} (conveyor bench client)"), flush=True)
    return summary


COLUMNS = [("total tok/s", "total_token_throughput", None, True),
           ("out tok/s", "output_throughput", None, True),
           ("TTFT p50 s", "ttft_ms", "p50", False), ("TTFT p99 s", "ttft_ms", "p99", False),
           ("TPOT p50 ms", "tpot_ms", "p50", False), ("E2E p50 s", "e2el_ms", "p50", False)]


def _value(r: dict[str, Any], key: str, sub: str | None) -> float:
    v = r[key][sub] if sub else r[key]
    return v / 1000 if sub and not key.startswith("tpot") else v


def side_by_side(rows: list[tuple[str, dict[str, Any] | str]], reference: dict[str, Any] | None) -> str:
    """Markdown: each system's figures, then (× Conveyor's) — throughput higher is better, latency lower."""
    head = "| system | ok / failed | " + " | ".join(c[0] for c in COLUMNS) + " | client CPU ms/req |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 3)]
    for name, r in rows:
        if isinstance(r, str):
            lines.append(f"| {name} | could not run: {r} |" + " |" * (len(COLUMNS) + 1))
            continue
        cells = []
        for _label, key, sub, _higher in COLUMNS:
            v = _value(r, key, sub)
            ratio = ""
            if reference is not None and r is not reference and v and not math.isnan(v):
                ratio = f" ({v / _value(reference, key, sub):.2f}×)"
            wide = key.startswith(("total", "output", "tpot"))
            cells.append(f"{v:,.1f}{ratio}" if wide else f"{v:.2f}{ratio}")
        cpu = r.get("client_cpu_ms_per_request")
        lines.append(f"| {name} | {r['completed']} / {r['failed']} | " + " | ".join(cells)
                     + f" | {'-' if cpu is None else f'{cpu:.1f}'} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=",".join(SYSTEMS), help="[default: %(default)s]")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--request-rate", type=float, default=math.inf)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-dir", type=Path, default=None,
                   help="converted weights [default: Conveyor's default]")
    p.add_argument("--peers-dir", type=Path, default=PEERS_DIR,
                   help="serve-vllm.sh's folder [default: %(default)s]")
    p.add_argument("--vllm-venv", type=Path, default=Path(os.environ.get("VENV", "/tmp/peers/vllm")))
    p.add_argument("--no-vllm-client", dest="vllm_client", action="store_false",
                   help="skip `vllm bench serve` (the peers' own client)")
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--out", type=Path, default=Path("/tmp/conveyor-peers"))
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: servers stopped, table printed
    systems = args.systems.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.model_dir is None:
        from engine.loader import resolve_model

        args.model_dir = resolve_model(None).path
    requests = random_workload(HFTokenizer(args.model_dir), args.num_prompts, args.input_len, args.output_len,
                               args.seed)
    rows: list[tuple[str, dict[str, Any] | str]] = []
    runs: dict[str, dict[str, Any]] = {}
    conveyor = [sys.executable, "-m", "launcher.cli", "serve", "--no-enable-prefix-caching", "--model",
                str(args.model_dir), "--worker-metrics-port", "0", "--webhook-metrics-port", "0"]
    vllm_ok = (args.vllm_venv / "bin" / "vllm").exists()

    stopped: list[str] = []

    def attempt(label: str, fn: Any) -> None:
        if stopped:
            rows.append((label, "not started: the run was interrupted"))
            return
        started = time.monotonic()
        try:
            runs[label] = fn()
            rows.append((label, runs[label]))
        except PeerUnavailable as exc:
            rows.append((label, str(exc)))
            print(f"{label}: could not run: {exc}", file=sys.stderr)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the servers are stopped; the table still prints
            stopped.append(label)
            rows.append((label, f"interrupted after {time.monotonic() - started:.0f} s (not finished)"))

    if "conveyor" in systems:
        def conveyor_runs() -> dict[str, Any]:
            with server([*conveyor, "--port", "18300", "--sse-keepalive-s", "0"],
                        "http://127.0.0.1:18300/ready", args.out / "conveyor.log"):
                result = measure("conveyor", 18300, requests, args)
                if args.vllm_client and vllm_ok:
                    attempt("conveyor, vllm bench serve client",
                            lambda: vllm_client(args.vllm_venv, 18300, args.model_dir, args, args.out))
                return result
        attempt("conveyor serve", conveyor_runs)
    if "vllm" in systems:
        def vllm_runs() -> dict[str, Any]:
            if not vllm_ok:
                raise PeerUnavailable(f"no vLLM at {args.vllm_venv}: run ../shared/peers/setup-vllm.sh")
            env = {"VENV": str(args.vllm_venv), "MODEL": str(args.model_dir), "PORT": "18301",
                   "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
            with server(["bash", str(args.peers_dir / "serve-vllm.sh"), "--no-enable-prefix-caching"],
                        "http://127.0.0.1:18301/v1/models", args.out / "vllm.log", env, timeout_s=900):
                result = measure("vllm", 18301, requests, args)
                if args.vllm_client:
                    attempt("vllm, vllm bench serve client",
                            lambda: vllm_client(args.vllm_venv, 18301, args.model_dir, args, args.out))
                return result
        attempt("vLLM CPU 0.32.0 (both cores)", vllm_runs)
    if "hf" in systems:
        def hf_runs() -> dict[str, Any]:
            cmd = [sys.executable, str(REPO / "bench" / "hf_server.py"), str(args.model_dir),
                   "--port", "18302", "--batch-size", str(args.hf_batch_size)]
            with server(cmd, "http://127.0.0.1:18302/v1/models", args.out / "hf.log"):
                return measure("hf", 18302, requests, args)
        attempt(f"HF generate, static batches of {args.hf_batch_size}", hf_runs)
    rows.sort(key=lambda row: "bench serve client" in row[0])  # the peers' own client's rows last
    reference = runs.get("conveyor serve")
    text = side_by_side(rows, reference)
    print("\n" + text)
    (args.out / "table.md").write_text(text + "\n")
    measured = [(k, v) for k, v in runs.items() if "_records" in v]
    (args.out / "runs.json").write_text(json.dumps({k: public(v) for k, v in runs.items()},
                                                   indent=2, default=str))
    if measured and plots.available():
        plots.cdfs([v for _, v in measured], [k for k, _ in measured], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
