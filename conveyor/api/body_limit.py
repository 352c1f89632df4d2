"""Request body size: larger than `payload_limit` answers 413 before the body is parsed."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.api.errors import PayloadTooLarge, render


class BodyLimit:
    """ASGI middleware: a declared Content-Length over the limit is refused at once; a body sent
    without one is counted as it arrives and refused when it passes the limit."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _error(self, size: str) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body ({size}) is larger than payload_limit ({self.limit} bytes)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await render(self._error(f"{int(declared)} bytes"), path)(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:  # rendered by the app's handler, in the route's dialect
                    raise HTTPException(413, self._error(f"over {self.limit} bytes").message)
            return message

        await self.app(scope, counting_receive, send)
