"""Conveyor side by side with its peers, in one sitting, on this machine: the same requests with
the same client (`conveyor bench`'s) against
  (1) Conveyor, full stack (`conveyor serve`, default model, prefix caching off), run twice (a and b),
  (2) vLLM's CPU build serving the same converted weights (--peers-dir: the folder holding its
      serve-vllm.sh, which runs vLLM from the venv --vllm-venv),
  (3) Hugging Face `generate` behind benchmarks/hf_server.py (the naive baseline),
in the order Conveyor a, vLLM, HF, Conveyor b (A-B-A: the drift within the sitting shows as b/a).
Each system is started, warmed, measured on every workload in turn, and stopped before the next.
Workloads (--workloads):
  peer     64 x 256 random tokens in (vLLM's random dataset, seed 0, as text), exactly 128 out, all at once
  mixed    64 prompts of 32-512 random token ids, outputs 16-256 (seeded: conveyor.bench.workloads'
           stream-client recipe), all at once
  poisson  the peer requests arriving at --poisson-rate req/s (Poisson, seeded)
  prefill  (only when named) the mixed prompts with one output token each, all at once: prefill speed
Then vLLM's own client (`vllm bench serve`, peer workload) against (1a) and (2), Conveyor with SSE
keep-alives off (`--sse-keepalive-s 0`: that client jams on a lone SSE comment). Prints one table
per workload, each figure's ratio to Conveyor's; a peer that cannot run is named, with why.

    python -m benchmarks.peers --peers-dir PEERS --out /tmp/peers-all   # everything (HF: all 64, slow)
    python -m benchmarks.peers --hf-num-prompts 16 --hf-workloads peer,mixed --no-vllm-client  # ~10 min
    python -m benchmarks.peers --peers-dir PEERS --workloads peer --systems conveyor,vllm --no-vllm-client
    python -m benchmarks.peers --peers-dir PEERS --dtype bf16 --systems conveyor,vllm --no-vllm-client  # bf16
    python -m benchmarks.peers --num-prompts 8 --hf-num-prompts 4    # a smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.peer_servers import SERVED, PeerUnavailable, server, vllm_client, vocab_size, warmup_requests
from benchmarks.peer_table import Row, midpoint, side_by_side, values
from conveyor.bench import plots
from conveyor.bench.options import Options
from conveyor.bench.report import public, table
from conveyor.bench.run import RunConfig, run
from conveyor.bench.workloads import HFTokenizer, Request, random_workload, stream_client_workload

SYSTEMS = ("conveyor", "vllm", "hf")
WORKLOADS = ("peer", "mixed", "poisson")
EXTRA_WORKLOADS = ("prefill",)  # diagnostics, run only when named in --workloads
CONVEYOR_A, CONVEYOR_B = "Conveyor a (`conveyor serve`)", "Conveyor b (drift: × a)"


def dtype_envs(dtype: str) -> tuple[dict[str, str], dict[str, str]]:
    """The environment of Conveyor's server and of serve-vllm.sh for --dtype: fp32 both (vLLM told
    so explicitly), or bf16 (Conveyor's bfloat16 GEMMs and KV cache, vLLM's whole model and its
    cache in bfloat16)."""
    if dtype == "bf16":
        conveyor = {"CONVEYOR_GEMM_DTYPE": "bfloat16", "CONVEYOR_KV_CACHE_DTYPE": "bfloat16"}
        return conveyor, {"DTYPE": "bfloat16"}
    return {}, {"DTYPE": "float32"}


def workloads(args: argparse.Namespace) -> dict[str, tuple[list[Request], float]]:
    """Each workload's requests and rate (inf: all at once)."""
    vocab = vocab_size(args.model_dir)
    peer = random_workload(HFTokenizer(args.model_dir), args.num_prompts, args.input_len, args.output_len,
                           args.seed)
    mixed = stream_client_workload(vocab, args.num_prompts, True, seed=args.seed)
    made = {"peer": (peer, math.inf),
            "mixed": (mixed, math.inf),
            "poisson": (peer, args.poisson_rate),
            # the mixed prompts with one output token each: how fast each system prefills ragged prompts
            "prefill": ([dataclasses.replace(r, output_len=1) for r in mixed], math.inf)}
    return {name: made[name] for name in args.workloads.split(",")}


def measure_all(name: str, port: int, loads: dict[str, tuple[list[Request], float]],
                args: argparse.Namespace, limit: int | None = None) -> dict[str, dict[str, Any]]:
    """One system's runs, one per workload (the first `limit` requests of each when given)."""
    opts = Options(base_url=f"http://127.0.0.1:{port}", model=SERVED)
    run(warmup_requests(args.model_dir), opts, RunConfig(progress=False))
    results = {}
    for load, (requests, rate) in loads.items():
        cfg = RunConfig(rate=rate, seed=args.seed, progress=not args.quiet)
        results[load] = run(requests[:limit] if limit else requests, opts, cfg)
        print(table(results[load], f"{name}, {load}"), flush=True)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=",".join(SYSTEMS), help="[default: %(default)s]")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"of {', '.join(WORKLOADS + EXTRA_WORKLOADS)} [default: %(default)s]")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=256, help="peer workload [default: %(default)s]")
    p.add_argument("--output-len", type=int, default=128, help="peer workload [default: %(default)s]")
    p.add_argument("--poisson-rate", type=float, default=4.0, help="req/s [default: %(default)s]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-aba", dest="aba", action="store_false", help="Conveyor once, not before and after")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: Conveyor with --gemm-dtype bfloat16 (its GEMMs in bfloat16; needs a CPU with "
                        "AVX512_BF16 or AMX) and --kv-cache-dtype bfloat16, vLLM with --dtype bfloat16 (its "
                        "whole model and KV cache); HF stays fp32 "
                        "[default: %(default)s]")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="converted weights [default: Conveyor's default]")
    p.add_argument("--peers-dir", type=Path, default=None,
                   help="the folder of serve-vllm.sh, which starts vLLM (kept outside this repository); "
                        "without it vLLM's row says so")
    p.add_argument("--vllm-venv", type=Path, default=Path(os.environ.get("VENV", "/tmp/peers/vllm")))
    p.add_argument("--no-vllm-client", dest="vllm_client", action="store_false",
                   help="skip `vllm bench serve` (the peers' own client)")
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--hf-num-prompts", type=int, default=None,
                   help="HF gets the first N requests of each workload [default: all]")
    p.add_argument("--hf-workloads", default=None,
                   help="the workloads HF runs (it is slow) [default: all of --workloads]")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results/peers",
                   help="[default: %(default)s]")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: servers stopped, tables printed
    systems = args.systems.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.model_dir is None:
        from conveyor.engine.loader import resolve_model

        args.model_dir = resolve_model(None).path
    loads = workloads(args)
    runs: dict[str, dict[str, dict[str, Any]] | str] = {}  # system -> workload -> summary, or why not
    extra: list[tuple[str, dict[str, Any] | str]] = []  # vllm bench serve rows (peer workload)
    vllm_ok = (args.vllm_venv / "bin" / "vllm").exists()
    client = args.vllm_client and vllm_ok and "peer" in loads
    conveyor = [sys.executable, "-m", "conveyor", "serve", "--no-enable-prefix-caching", "--model",
                str(args.model_dir), "--worker-metrics-port", "0", "--webhook-metrics-port", "0",
                "--port", "18300", "--sse-keepalive-s", "0"]
    conveyor_env, vllm_env = dtype_envs(args.dtype)
    stopped: list[str] = []

    def attempt(label: str, fn: Callable[[], Any], into: Callable[[Any], None]) -> None:
        if stopped:
            return into("not started: the run was interrupted")
        started = time.monotonic()
        print(f"== {label}", file=sys.stderr, flush=True)
        try:
            into(fn())
        except PeerUnavailable as exc:
            into(str(exc))
            print(f"{label}: could not run: {exc}", file=sys.stderr)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the servers are stopped; the tables still print
            stopped.append(label)
            into(f"interrupted after {time.monotonic() - started:.0f} s (not finished)")

    def conveyor_leg(label: str, own_client: bool) -> Callable[[], Any]:
        def leg() -> dict[str, dict[str, Any]]:
            with server(conveyor, "http://127.0.0.1:18300/ready", args.out / f"{label}.log", conveyor_env):
                results = measure_all(label, 18300, loads, args)
                if own_client:
                    attempt("Conveyor a, vllm bench serve client",
                            lambda: vllm_client(args.vllm_venv, 18300, args.model_dir, args, args.out),
                            lambda r: extra.append(("Conveyor a, `vllm bench serve` client", r)))
                return results
        return leg

    def vllm_leg() -> dict[str, dict[str, Any]]:
        if args.peers_dir is None:
            raise PeerUnavailable("no --peers-dir: the folder of serve-vllm.sh")
        if not vllm_ok:
            raise PeerUnavailable(f"no vLLM at {args.vllm_venv} (--vllm-venv)")
        env = {"VENV": str(args.vllm_venv), "MODEL": str(args.model_dir), "PORT": "18301",
               "VLLM_CPU_OMP_THREADS_BIND": "0-1", **vllm_env}
        with server(["bash", str(args.peers_dir / "serve-vllm.sh"), "--no-enable-prefix-caching"],
                    "http://127.0.0.1:18301/v1/models", args.out / "vllm.log", env, timeout_s=900):
            results = measure_all("vllm", 18301, loads, args)
            if client:
                attempt("vllm, vllm bench serve client",
                        lambda: vllm_client(args.vllm_venv, 18301, args.model_dir, args, args.out),
                        lambda r: extra.append(("vLLM, `vllm bench serve` client", r)))
            return results

    def hf_leg() -> dict[str, dict[str, Any]]:
        cmd = [sys.executable, "-m", "benchmarks.hf_server", str(args.model_dir),
               "--port", "18302", "--batch-size", str(args.hf_batch_size)]
        with server(cmd, "http://127.0.0.1:18302/v1/models", args.out / "hf.log"):
            mine = {k: v for k, v in loads.items() if k in (args.hf_workloads or args.workloads).split(",")}
            return measure_all("hf", 18302, mine, args, args.hf_num_prompts)

    def store(label: str) -> Callable[[Any], None]:
        return lambda r: runs.__setitem__(label, r)

    hf_label = f"HF generate, static batches of {args.hf_batch_size}" + (
        f" (first {args.hf_num_prompts} requests)" if args.hf_num_prompts else "")
    if "conveyor" in systems:
        attempt(CONVEYOR_A, conveyor_leg("conveyor-a", client), store(CONVEYOR_A))
    if "vllm" in systems:
        attempt("vLLM CPU 0.32.0 (both cores)", vllm_leg, store("vLLM CPU 0.32.0 (both cores)"))
    if "hf" in systems:
        attempt(hf_label, hf_leg, store(hf_label))
    if "conveyor" in systems and args.aba:
        attempt(CONVEYOR_B, conveyor_leg("conveyor-b", False), store(CONVEYOR_B))
    report(runs, extra, loads, args)
    return 0


def report(runs: dict[str, Any], extra: list[tuple[str, Any]], loads: dict[str, Any],
           args: argparse.Namespace) -> None:
    """One table per workload (printed, and in OUT/WORKLOAD/table.md with runs.json and plots)."""
    texts = []
    for load, (requests, rate) in loads.items():
        skipped = "not run on this workload (--hf-workloads)"
        got = {name: r if isinstance(r, str) else r.get(load, skipped) for name, r in runs.items()}
        ours = [r for name, r in got.items() if name in (CONVEYOR_A, CONVEYOR_B) and not isinstance(r, str)]
        base = midpoint(ours)
        rows = []
        for name, r in got.items():
            if name == CONVEYOR_A:
                rows.append(Row(name, r))
            elif name == CONVEYOR_B:
                a = got.get(CONVEYOR_A)
                rows.append(Row(name, r, values(a) if isinstance(a, dict) else None))
            else:
                rows.append(Row(name, r, base))
        if load == "peer":
            rows += [Row(name, r, values(got[CONVEYOR_A]) if isinstance(got.get(CONVEYOR_A), dict) else None)
                     for name, r in extra]
        title = (f"### {load}: {len(requests)} requests, "
                 f"{'all at once' if math.isinf(rate) else f'Poisson {rate:g} req/s (seed {args.seed})'}")
        text = f"{title}\n\n{side_by_side(rows)}\n\n(ratios: peers to the mean of Conveyor a and b; " \
               "b to a; `vllm bench serve` rows to Conveyor a)"
        texts.append(text)
        folder = args.out / load
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "table.md").write_text(text + "\n")
        measured = {n: r for n, r in got.items() if isinstance(r, dict)}
        (folder / "runs.json").write_text(json.dumps({n: public(r) for n, r in measured.items()},
                                                     indent=2, default=str))
        if measured and plots.available():
            plots.cdfs(list(measured.values()), list(measured), folder)
    print("\n" + "\n\n".join(texts))
    (args.out / "tables.md").write_text("\n\n".join(texts) + "\n")


if __name__ == "__main__":
    sys.exit(main())
