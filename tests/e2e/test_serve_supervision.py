"""`conveyor serve` supervises: a worker SIGKILLed is restarted while the api and the other worker
keep serving (conveyor/launcher/supervisor.py); the service itself does not stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from conveyor.launcher.redis_server import free_port

pytestmark = pytest.mark.slow

START_S = 300.0  # a cold start on a loaded 2-core machine: model load, kernel cache, Redis


def workers(serve: psutil.Process) -> dict[int, psutil.Process]:
    found = {}
    for child in serve.children(recursive=True):
        try:
            if child.cmdline()[-1:] == ["worker"]:
                found[child.pid] = child
        except psutil.NoSuchProcess:
            pass
    return found


def until(what: str, check, proc: subprocess.Popen, log: Path, timeout: float = START_S):  # type: ignore[no-untyped-def]
    """Polls `check` until it returns a truthy value; fails with the log if serve exits first."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"serve exited while waiting for {what}:\n{log.read_text()}"
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s:\n{log.read_text()}"
        time.sleep(0.2)


def healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_killed_worker_is_restarted_and_the_service_keeps_serving(tmp_path, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "serve", "--port", str(port), "--data-dir", str(tmp_path),
             "--model", str(tiny_model_dir), "--kv-cache-memory", "64MiB", "--workers", "2",
             "--webhook-workers", "1", "--worker-metrics-port", "0", "--webhook-metrics-port", "0"],
            env=env, stdout=log, stderr=log,
        )
    base = f"http://127.0.0.1:{port}"
    serve = psutil.Process(proc.pid)
    try:
        until("/health", lambda: healthy(base + "/health"), proc, log_path)
        before = until("two workers", lambda: (w := workers(serve)) and len(w) == 2 and w, proc, log_path)
        victim = next(iter(before.values()))
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        # its replacement: a new worker process, while the api kept answering
        def replaced() -> dict[int, psutil.Process] | None:
            now = workers(serve)
            return now if len(now) == 2 and set(now) != set(before) else None

        after = until("a restarted worker", replaced, proc, log_path)
        assert victim.pid not in after
        assert healthy(base + "/health")
        # the job may wait for the replacement's model load or for a steal from the dead worker's
        # affinity stream: a loaded machine makes that minutes, which is no fault of the service
        r = httpx.post(base + "/generate", json={"inputs": "Say hi", "parameters": {"max_new_tokens": 3}},
                       timeout=START_S)
        assert r.status_code == 200, r.text
        assert proc.poll() is None
        assert "worker-" in log_path.read_text() and "restarting it" in log_path.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, log_path.read_text()
