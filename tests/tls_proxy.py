"""A TLS front for a plain Valkey in the tests: the embedded valkey-server is built without TLS
("Failed finding TLS support"), so a thread here terminates TLS (a certificate `trustme` issues for
127.0.0.1) and pipes the bytes to the server's plain port. Clients see what a TLS Valkey shows them:
a handshake, a certificate to verify against a CA, then RESP."""

from __future__ import annotations

import asyncio
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

import trustme

from conveyor.launcher.redis_server import free_port


@dataclass
class TestCA:
    __test__ = False  # a fixture's type, not a test class
    """A CA and a server certificate for 127.0.0.1, the CA's PEM written to `ca_file`."""

    ca: trustme.CA
    server_context: ssl.SSLContext
    ca_file: Path

    @classmethod
    def create(cls, directory: Path) -> TestCA:
        ca = trustme.CA()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
        ca_file = directory / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        return cls(ca, context, ca_file)


@dataclass
class TLSProxy:
    """Listens with TLS on `port` (free, or the one given) and forwards to `backend_port`; one asyncio
    loop in a thread of its own (an SSL socket is not for two threads at once)."""

    backend_port: int
    context: ssl.SSLContext
    port: int = 0
    handshakes: int = 0  # TLS sessions accepted: proof the clients spoke TLS
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    def start(self) -> TLSProxy:
        self.port = self.port or free_port()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.context))
        threading.Thread(target=self._loop.run_forever, name=f"tls-proxy-{self.port}", daemon=True).start()
        return self

    def close(self) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for writer in self._writers:
                writer.close()
        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        self.handshakes += 1  # called only after the TLS handshake succeeded
        try:
            backend_in, backend_out = await asyncio.open_connection("127.0.0.1", self.backend_port)
        except OSError:
            client_out.close()
            return
        self._writers |= {client_out, backend_out}
        await asyncio.gather(_pipe(client_in, backend_out), _pipe(backend_in, client_out))


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copies until the source ends or either side fails, then closes the sink (which ends the other
    direction's read too)."""
    try:
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        sink.close()
