"""`conveyor serve` started as a user starts it, for the end-to-end tests: on a port picked just
before it starts (and picked again if someone took it first), with no metrics ports (the defaults
are fixed numbers another process on the machine may hold); ready once a worker is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from conveyor.launcher.redis_server import free_port
from tests.readiness import BIND_CONFLICT, answers, wait_until, without_polls

ATTEMPTS = 3
NO_METRICS_PORTS = ("--worker-metrics-port", "0", "--webhook-metrics-port", "0")


@dataclass
class Served:
    data_dir: Path
    argv: list[str]  # the model and its options, after `conveyor serve`
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # "serve": the latest
    base_url: str = ""
    attempts: int = 0

    @property
    def log(self) -> Path:
        return self.data_dir / "serve.log"

    def logs(self) -> str:
        return without_polls(self.log.read_text())[-8000:]

    def start(self) -> None:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        self.attempts += 1
        with open(self.log, "wb") as log:
            self.processes["serve"] = subprocess.Popen(
                [sys.executable, "-m", "conveyor", "serve", "--port", str(port),
                 "--data-dir", str(self.data_dir), *NO_METRICS_PORTS, *self.argv],
                env=env, stdout=log, stderr=log,
            )
        self.base_url = f"http://127.0.0.1:{port}"

    def restart_on_conflict(self, _name: str) -> bool:
        """Starts it again on another port if it stopped because one of its ports was taken."""
        if self.attempts >= ATTEMPTS or not BIND_CONFLICT.search(self.log.read_text()):
            return False
        self.start()
        return True

    def wait_ready(self) -> None:
        """Until /ready answers and counts a live worker (the api is ready before any worker is)."""
        wait_until(lambda: answers(self.base_url + "/ready") and self.workers() >= 1,
                   "`conveyor serve` ready with a worker", self.processes, self.logs,
                   respawn=self.restart_on_conflict)

    def workers(self) -> int:
        return int(httpx.get(self.base_url + "/ready", timeout=5).json().get("workers") or 0)

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.processes["serve"]

    def stop(self) -> int:
        """SIGTERM, as Ctrl-C would: serve stops every child; its exit status."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def start_serve(data_dir: Path, *argv: str) -> Served:
    """`conveyor serve --data-dir data_dir *argv`, ready; stopped by the caller (SIGTERM)."""
    served = Served(data_dir, list(argv))
    served.start()
    try:
        served.wait_ready()
    except BaseException:
        served.stop()
        raise
    return served
