"""A real HTTP receiver on 127.0.0.1 for tests: it records every request and answers from a script
(status codes per path, the last one repeating), and can hold a path's requests (a slow receiver)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    requests: list[Received] = field(default_factory=list)
    scripts: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    holds: dict[str, float] = field(default_factory=dict)  # path → seconds to hold each request
    in_progress: dict[str, int] = field(default_factory=dict)
    released: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def script(self, path: str, *answers: int | tuple[int, dict[str, str]]) -> None:
        self.scripts[path] = [a if isinstance(a, tuple) else (a, {}) for a in answers]

    def hold(self, path: str, seconds: float) -> None:
        self.holds[path] = seconds

    def got(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if r.path == path]

    async def wait_for(self, path: str, n: int, timeout: float = 60) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(got := self.got(path)) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{path}: {len(got)} of {n} requests after {timeout}s")
            await asyncio.sleep(0.02)
        return got

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.lock:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.requests.append(Received(self.path, headers, body, time.time()))
                    answers = receiver.scripts.get(self.path) or [(200, {})]
                    status, headers = answers.pop(0) if len(answers) > 1 else answers[0]
                    receiver.in_progress[self.path] = receiver.in_progress.get(self.path, 0) + 1
                try:
                    if self.path in receiver.holds:
                        receiver.released.wait(receiver.holds[self.path])
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:  # the client gave up (its timeout)
                    pass
                finally:
                    with receiver.lock:
                        receiver.in_progress[self.path] -= 1

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.released.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
