"""`conveyor serve` as a user runs it: embedded Redis, api, worker, webhook worker; SIGTERM stops
every child, the redis-server included."""

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


def wait_serving(proc: subprocess.Popen, url: str, log: Path, timeout: float = 180) -> None:
    """Until `url` answers 200; fails with the log if the process exits or the timeout passes."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()  # not serving in time
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)


def test_serve_answers_then_stops_every_child(tmp_path, default_model_dir) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "serve", "--port", str(port), "--data-dir", str(tmp_path),
         "--model", str(default_model_dir), "--kv-cache-memory", "256MiB"],
        env=env, stdout=log, stderr=log,
    )
    base = f"http://127.0.0.1:{port}"
    children: list[psutil.Process] = []
    try:
        wait_serving(proc, base + "/health", tmp_path / "serve.log")
        r = httpx.post(base + "/generate", json={"inputs": "Say hi", "parameters": {"max_new_tokens": 3}},
                       timeout=180)
        assert r.status_code == 200, r.text
        children = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        assert "valkey-server" in names and " worker" in names and " api" in names and " webhooks" in names
        assert (tmp_path / "redis" / "appendonlydir").is_dir()  # AOF is on
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "serve.log").read_text()
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"orphans left: {[c.cmdline() for c in alive]}"
    assert "Conveyor is serving" in (tmp_path / "serve.log").read_text()
