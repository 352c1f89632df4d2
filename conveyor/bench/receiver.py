"""A local webhook receiver for the jobs API's webhook mode: a minimal HTTP/1.1 server on
127.0.0.1 that answers 200 to every POST and hands the job in its body to whoever waits for it.
(The server must allow the target: `--webhook-allow 127.0.0.0/8` and a webhook secret.)"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any


class Receiver:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self._server: asyncio.Server | None = None
        self._jobs: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._arrived: dict[str, float] = {}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hooks"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _future(self, job_id: str) -> asyncio.Future[dict[str, Any]]:
        return self._jobs.setdefault(job_id, asyncio.get_running_loop().create_future())

    async def wait(self, job_id: str) -> dict[str, Any]:
        return await self._future(job_id)

    def arrived_at(self, job_id: str) -> float:
        return self._arrived[job_id]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                raw = await reader.readexactly(length)
                now = time.perf_counter()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                data = json.loads(raw or b"{}").get("data") or {}
                job_id = data.get("id")
                if job_id and not self._future(job_id).done():  # retries repeat; the first counts
                    self._arrived[job_id] = now
                    self._future(job_id).set_result(data)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()
