"""`conveyor bench` against a real api + worker (tiny model): each dialect runs a small workload
with no errors and its JSON counts every request and token; a concurrency sweep writes its plots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.conftest import ALICE_SECRET, KEYS
from tests.conftest import REPO, start_service, stop_service

N, IN, OUT = 6, 12, 4


def bench(service, tiny_model_dir: Path, out: Path, *args: str) -> dict:  # type: ignore[no-untyped-def]
    key = next(iter(KEYS))
    cmd = [sys.executable, "-m", "conveyor", "bench", "--base-url", service.base_url, "--api-key", key,
           "--tokenizer", str(tiny_model_dir), "--num-prompts", str(N), "--input-len", str(IN),
           "--output-len", str(OUT), "--no-progress", "--result-json", str(out), "--slo", "e2el=600s", *args]
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr + service.logs()
    assert "total token throughput" in done.stdout
    return json.loads(out.read_text())


@pytest.mark.parametrize("backend", [["--backend", "completions"], ["--backend", "chat"],
                                     ["--backend", "tgi"],
                                     ["--backend", "jobs", "--jobs-mode", "stream"],
                                     ["--backend", "jobs", "--jobs-mode", "poll"]])
def test_each_dialect_runs_a_bench_without_errors(tiny_service, tiny_model_dir: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                  backend: list[str]) -> None:
    (run,) = bench(tiny_service, tiny_model_dir, tmp_path / "r.json", *backend)["runs"]
    assert (run["requests"], run["completed"], run["failed"], run["errors"]) == (N, N, 0, {})
    assert run["good_requests"] == N and run["client_cpu_s"] > 0
    if backend[1] != "tgi":  # TGI has no ignore_eos: the tiny model may end early at EOS
        assert run["output_tokens"] == N * OUT
    assert run["input_tokens"] >= N * IN
    assert run["e2el_ms"]["p50"] > 0
    if backend[-1] != "poll":  # polling sees no first token
        assert 0 < run["ttft_ms"]["p50"] <= run["e2el_ms"]["p99"]


def test_a_concurrency_sweep_writes_one_run_each_and_the_plots(tiny_service, tiny_model_dir: Path,  # type: ignore[no-untyped-def]
                                                               tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = bench(tiny_service, tiny_model_dir, tmp_path / "r.json", "--sweep-concurrency", "1,3",
                   "--plot-dir", str(tmp_path / "plots"), "--request-rate", "50", "--arrival", "fixed")
    assert [r["config"]["max_concurrency"] for r in result["runs"]] == [1, 3]
    assert all(r["completed"] == N and r["output_tokens"] == N * OUT for r in result["runs"])
    for name in ("latency_cdf.png", "sweep.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_webhook_mode_measures_submit_to_webhook(tmp_path: Path, services_redis, tiny_model_dir: Path,  # type: ignore[no-untyped-def]
                                                 keys_file: Path) -> None:
    """--jobs-mode webhook: the client's own receiver on 127.0.0.1 gets every job's `completed`
    webhook (delivered by a real webhook process), and the latency is reported per request."""
    service = start_service(tmp_path, services_redis.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir), "CONVEYOR_API_KEYS_FILE": str(keys_file),
        "CONVEYOR_KV_CACHE_MEMORY": "16MiB", "CONVEYOR_WEBHOOK_SECRETS": f"alice={ALICE_SECRET}",
        "CONVEYOR_WEBHOOK_ALLOW": "127.0.0.0/8"}, workers=1, webhook_workers=1)
    try:
        (run,) = bench(service, tiny_model_dir, tmp_path / "r.json", "--backend", "jobs",
                       "--jobs-mode", "webhook", "--timeout", "120")["runs"]
    finally:
        stop_service(service)
    assert (run["completed"], run["failed"], run["output_tokens"]) == (N, 0, N * OUT)
    assert 0 < run["webhook_latency_ms"]["p50"] <= run["webhook_latency_ms"]["p99"]
