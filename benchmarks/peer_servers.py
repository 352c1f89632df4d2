"""Starting and stopping the systems benchmarks/peers.py and benchmarks/overhead.py measure, and vLLM's own
client: each server runs in its own process group (stopping it stops its children), its log in a
file, and a peer that cannot start says why."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from conveyor.bench.workloads import Request, stream_client_workload
from conveyor.launcher.redis_server import _die_with_parent

REPO = Path(__file__).resolve().parents[1]
SERVED = "smollm2-135m"


def vocab_size(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def warmup_requests(model_dir: Path) -> list[Request]:
    """4 short requests (16 ids in, 8 out) before the first measured run: compiled paths, caches."""
    return stream_client_workload(vocab_size(model_dir), 4, False, 16, 8, seed=99)


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
           timeout_s: float = 600) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        # its own group: stopping it stops its children; and it dies with this process, however
        # this one ends (a server left behind would load the next sitting)
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env={**os.environ, **(env or {})}, cwd=REPO,
                                start_new_session=True, preexec_fn=_die_with_parent)
    try:
        wait_ready(ready_url, proc, timeout_s, log)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def vllm_client(venv: Path, port: int, model_dir: Path, args: Any, out: Path) -> dict[str, Any]:
    """`vllm bench serve` on the peer workload (its own random dataset, same seed); its result
    JSON, in our key names."""
    name = f"vllm-client-{port}.json"
    cmd = [str(venv / "bin" / "vllm"), "bench", "serve", "--backend", "openai",
           "--endpoint", "/v1/completions",
           "--base-url", f"http://127.0.0.1:{port}", "--model", str(model_dir), "--tokenizer", str(model_dir),
           "--served-model-name", SERVED, "--dataset-name", "random", "--random-input-len",
           str(args.input_len),
           "--random-output-len", str(args.output_len), "--random-range-ratio", "0",
           "--num-prompts", str(args.num_prompts), "--ignore-eos", "--request-rate", "inf",
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
