"""Where the engine is built, when another thread steps it: the main thread vs a short-lived one.

    .venv/bin/python benchmarks/engine_thread.py [--pairs 2] [--workload peer|mixed]

The worker steps its engine on an engine thread. Built on the main thread first, the process holds
two OpenMP teams, and libgomp parks the engine thread's team between ops (conveyor/engine/off_main.py). Each
leg is a fresh child process, alternating `main` (built on the main thread: the worker before
conveyor/engine/off_main.py) and `off-main` (built by build_off_main, as the worker does now), both stepped on
their own thread through benchmarks/overhead.py's loop on the same requests (64, default model, fp32,
prefix caching off, 4 GiB of KV). Also, once per leg: SiLU on a 64 x 576 tensor on the stepping
thread, µs per call. Prints each leg and the off-main / main ratio per pair.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def leg(build: str, model_dir: Path, requests_file: Path) -> dict[str, Any]:
    """In a child process: build the engine as told, step it on a thread, time SiLU there too."""
    import torch

    from benchmarks.overhead import _step_all
    from benchmarks.peer_servers import warmup_requests
    from conveyor.bench.workloads import Request
    from conveyor.engine.engine import Engine
    from conveyor.engine.off_main import build_off_main
    from conveyor.launcher.roles import engine_config
    from conveyor.settings import Settings

    def make() -> Engine:
        return Engine.from_pretrained(model_dir, engine_config(Settings(enable_prefix_caching=False,
                                                                        kv_cache_memory="4GiB")))

    engine = build_off_main(make) if build == "off-main" else make()
    reqs = [Request(prompt=ids, prompt_len=len(ids), output_len=out)
            for ids, out in json.loads(requests_file.read_text())]
    results: dict[str, Any] = {}

    def run() -> None:
        x = torch.randn(64, 576)
        torch.nn.functional.silu(x)
        start = time.perf_counter()
        for _ in range(5000):
            torch.nn.functional.silu(x)
        results["silu_us"] = (time.perf_counter() - start) / 5000 * 1e6
        _step_all(engine, warmup_requests(model_dir), reqs, results)

    stepper = threading.Thread(target=run, name="engine")
    stepper.start()
    stepper.join()
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--workload", choices=["peer", "mixed"], default="peer")
    p.add_argument("--leg", choices=["main", "off-main"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--requests-file", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model_dir is None:
        from conveyor.engine.loader import resolve_model

        args.model_dir = resolve_model(None).path
    if args.leg:
        args.out.write_text(json.dumps(leg(args.leg, args.model_dir, args.requests_file)))
        return 0

    from benchmarks.overhead import requests_of

    with tempfile.TemporaryDirectory() as tmp:
        requests_file = Path(tmp) / "requests.json"
        reqs = requests_of(args.workload, args.model_dir, 64, text=False)
        requests_file.write_text(json.dumps([[list(r.prompt), r.output_len] for r in reqs]))
        ratios = []
        for pair in range(args.pairs):
            tok_s = {}
            for build in ("main", "off-main"):
                out = Path(tmp) / f"{build}-{pair}.json"
                cmd = [sys.executable, __file__, "--leg", build, "--model-dir", str(args.model_dir),
                       "--requests-file", str(requests_file), "--out", str(out)]
                subprocess.run(cmd, check=True, cwd=REPO)
                r = json.loads(out.read_text())
                tok_s[build] = r["total_token_throughput"]
                step_ms = r["step_s"] / r["steps"] * 1000
                print(f"pair {pair + 1} {build:8s}  total {r['total_token_throughput']:7.1f} tok/s  "
                      f"{step_ms:6.1f} ms/step  SiLU {r['silu_us']:5.1f} µs", flush=True)
            ratios.append(tok_s["off-main"] / tok_s["main"])
    print(f"off-main / main total tok/s: median {median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
