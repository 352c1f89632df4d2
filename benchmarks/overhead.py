"""Full stack vs the engine alone, on the same requests, in one sitting, and where the full stack's
extra time goes.

    python -m benchmarks.overhead                       # peer: engine, full, engine, full, engine
    python -m benchmarks.overhead --workload mixed --order full,engine,full
    python -m benchmarks.overhead --num-prompts 8       # a smoke run

Legs, each in its own processes and self-contained (start, warm, measure, stop):
  engine  the engine in a child process (as benchmarks/engine.py: every request added at once, stepped
          until done), configured as `conveyor serve` configures its worker (prefix caching off);
  full    `conveyor serve` over HTTP with `conveyor bench`'s client (all requests at once, streaming
          /v1/completions, the same prompts — as text, which the api tokenizes, unless
          --prompt-format ids).
The default order engine, full, engine, full, engine puts an engine leg on either side of each full
leg: each full leg is compared with the mean of those two, so the drift within the sitting (10 % and
more on this shared machine) cancels to first order, and the median of the two ratios is reported.
For the full stack it reports CPU seconds per process over the measured run, from /proc (api, worker — its
main thread, the asyncio loop that reads jobs and publishes tokens to Redis, apart from its engine
thread and OpenMP pool — valkey, webhooks, launcher, the client), and the worker's own engine step
seconds (its `tgi_batch_inference_duration` histogram) against the engine alone's; the ratio
full/engine is of total tokens per second.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.overhead_report import report
from benchmarks.peer_servers import SERVED, server, vocab_size, warmup_requests
from benchmarks.procstat import delta, snapshot
from conveyor.bench.options import Options
from conveyor.bench.run import RunConfig, run
from conveyor.bench.workloads import HFTokenizer, Request, random_workload, stream_client_workload

REPO = Path(__file__).resolve().parents[1]

PORT, METRICS_PORT = 18320, 18321
_STEP = re.compile(r'^tgi_batch_inference_duration_(sum|count)\{method="(\w+)"\} ([0-9.eE+-]+)$', re.M)


def requests_of(workload: str, model_dir: Path, n: int, text: bool) -> list[Request]:
    if workload == "mixed":  # the stream-client recipe's mixed requests (token ids)
        return stream_client_workload(vocab_size(model_dir), n, True)
    return random_workload(HFTokenizer(model_dir), n, 256, 128, 0, as_ids=not text)


def step_totals(metrics_text: str) -> tuple[float, int]:
    """(seconds, steps) over both methods of the worker's step histogram."""
    seconds, steps = 0.0, 0
    for kind, _method, value in _STEP.findall(metrics_text):
        if kind == "sum":
            seconds += float(value)
        else:
            steps += int(float(value))
    return seconds, steps


def engine_leg(model_dir: Path, requests_file: Path, kv: str) -> dict[str, Any]:
    """In this (child) process: the engine alone on the requests' token ids (made by the parent:
    this process loads the engine as the worker does, and nothing else — no tokenizer)."""

    from conveyor.engine.engine import Engine
    from conveyor.engine.off_main import build_off_main
    from conveyor.launcher.roles import engine_config
    from conveyor.settings import Settings

    # Built and stepped as the worker does (conveyor/launcher/roles.py run_worker).
    engine = build_off_main(lambda: Engine.from_pretrained(
        model_dir, engine_config(Settings(enable_prefix_caching=False, kv_cache_memory=kv))))
    warm = warmup_requests(model_dir)
    reqs = [Request(prompt=ids, prompt_len=len(ids), output_len=out)
            for ids, out in json.loads(requests_file.read_text())]
    results: dict[str, Any] = {}
    # Stepped on its own thread, as the worker's engine thread does.
    stepper = threading.Thread(target=lambda: _step_all(engine, warm, reqs, results), name="engine")
    stepper.start()
    stepper.join()
    return results


def _step_all(engine: Any, warm: list[Request], reqs: list[Request], results: dict[str, Any]) -> None:
    import torch

    from conveyor.engine.params import StoppingParams

    for label, batch in (("warmup", warm), ("measured", reqs)):
        for k, r in enumerate(batch):
            engine.add(f"{label}{k}", list(r.prompt), stopping=StoppingParams(max_new_tokens=r.output_len,
                                                                               ignore_eos=True))
        cpu0, t0, step_s, steps, out = time.process_time(), time.perf_counter(), 0.0, 0, 0
        with torch.inference_mode():
            while engine.has_unfinished():
                before = engine.last_step
                out += sum(1 for e in engine.step() if e.token_id is not None)
                if engine.last_step is not None and engine.last_step is not before:
                    step_s, steps = step_s + engine.last_step.seconds, steps + 1
        results.update({"duration_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0,
                        "step_s": step_s, "steps": steps, "output_tokens": out,
                        "input_tokens": sum(len(r.prompt) for r in batch)})
    results["total_token_throughput"] = (results["input_tokens"] + results["output_tokens"]) / \
        results["duration_s"]


def run_engine(args: argparse.Namespace) -> dict[str, Any]:
    out = args.out / f"engine-{time.monotonic_ns()}.json"
    requests_file = args.out / f"requests-{args.workload}-{args.num_prompts}.json"
    reqs = requests_of(args.workload, args.model_dir, args.num_prompts, text=False)
    requests_file.write_text(json.dumps([[list(r.prompt), r.output_len] for r in reqs]))
    cmd = [sys.executable, "-m", "benchmarks.overhead", "--leg", "engine",
           "--requests-file", str(requests_file), "--model-dir", str(args.model_dir),
           "--kv-cache-memory", args.kv_cache_memory, "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=REPO)
    return json.loads(out.read_text())


def run_full(args: argparse.Namespace, label: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "conveyor", "serve", "--no-enable-prefix-caching", "--model",
           str(args.model_dir), "--port", str(PORT), "--worker-metrics-port", str(METRICS_PORT),
           "--webhook-metrics-port", "0", "--sse-keepalive-s", "0", "--kv-cache-memory", args.kv_cache_memory]
    reqs = requests_of(args.workload, args.model_dir, args.num_prompts, text=args.prompt_format == "text")
    warm = warmup_requests(args.model_dir)
    opts = Options(base_url=f"http://127.0.0.1:{PORT}", model=SERVED)
    metrics = f"http://127.0.0.1:{METRICS_PORT}/metrics"
    with server(cmd, f"http://127.0.0.1:{PORT}/ready", args.out / f"{label}.log") as proc:
        run(warm, opts, RunConfig(progress=False))
        cpu0, steps0 = snapshot(proc.pid), step_totals(httpx.get(metrics).text)
        summary = run(reqs, opts, RunConfig(progress=not args.quiet))
        cpu1, steps1 = snapshot(proc.pid), step_totals(httpx.get(metrics).text)
    summary.pop("_records")
    summary["cpu_s"] = {**delta(cpu0, cpu1).seconds, "client": summary["client_cpu_s"]}
    summary["step_s"], summary["steps"] = steps1[0] - steps0[0], steps1[1] - steps0[1]
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["peer", "mixed"], default="peer")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--order", default="engine,full,engine,full,engine",
                   help="legs, in turn [default: %(default)s]")
    p.add_argument("--prompt-format", choices=["text", "ids"], default="text",
                   help="how the full stack gets the peer prompts [default: %(default)s]")
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--kv-cache-memory", default="4GiB",
                   help="both legs' KV budget, so neither reserves more of a busy machine's memory "
                        "[default: %(default)s, as benchmarks/engine.py]")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks/results/overhead",
                   help="[default: %(default)s]")
    p.add_argument("--leg", choices=["engine"], help=argparse.SUPPRESS)  # the child process's part
    p.add_argument("--requests-file", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    if args.model_dir is None:
        from conveyor.engine.loader import resolve_model

        args.model_dir = resolve_model(None).path
    if args.leg == "engine":
        args.out.write_text(json.dumps(engine_leg(args.model_dir, args.requests_file,
                                                  args.kv_cache_memory)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    legs: list[tuple[str, dict[str, Any]]] = []
    for i, leg in enumerate(args.order.split(",")):
        label = f"{leg} {chr(ord('a') + sum(1 for name, _ in legs if name.startswith(leg)))}"
        print(f"== {label} ({i + 1} of {len(args.order.split(','))})", file=sys.stderr, flush=True)
        legs.append((label, run_engine(args) if leg == "engine" else run_full(args, label.replace(" ", "-"))))
    text = report(legs, args.workload, args.num_prompts)
    print("\n" + text)
    (args.out / "overhead.md").write_text(text + "\n")
    (args.out / "legs.json").write_text(json.dumps(dict(legs), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
