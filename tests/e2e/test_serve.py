"""`conveyor serve` as a user runs it: embedded Redis, api, worker, webhook worker; SIGTERM stops
every child, the redis-server included."""

from __future__ import annotations

import httpx
import psutil
import pytest

from tests.e2e.serving import start_serve

pytestmark = pytest.mark.slow


def test_serve_answers_then_stops_every_child(tmp_path, default_model_dir) -> None:  # type: ignore[no-untyped-def]
    served = start_serve(tmp_path, "--model", str(default_model_dir), "--kv-cache-memory", "256MiB")
    children: list[psutil.Process] = []
    try:
        r = httpx.post(served.base_url + "/generate",
                       json={"inputs": "Say hi", "parameters": {"max_new_tokens": 3}}, timeout=180)
        assert r.status_code == 200, r.text
        children = psutil.Process(served.process.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        assert "valkey-server" in names and " worker" in names and " api" in names and " webhooks" in names
        assert (tmp_path / "redis" / "appendonlydir").is_dir()  # AOF is on
    finally:
        assert served.stop() == 0, served.logs()
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"orphans left: {[c.cmdline() for c in alive]}"
    assert "Conveyor is serving" in served.log.read_text()
