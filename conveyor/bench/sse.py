"""Server-Sent Events from an aiohttp response: (event, data) per message, comments skipped,
whatever the network chunking (a keep-alive comment alone in a chunk included).

Parsed from the raw bytes: a message ends at a blank line; lines end in LF, CRLF or CR (the SSE
spec's three); only a message's own lines are decoded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp


def _message(block: bytes) -> tuple[str, str] | None:
    """One message's (event, data); None when it has no data line (comments only)."""
    event, data = "message", []
    for raw in block.split(b"\n"):
        if not raw or raw.startswith(b":"):
            continue
        name, _, value = raw.decode("utf-8", "replace").partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    return (event, "\n".join(data)) if data else None


def _lf(buffer: bytes) -> bytes:
    """CRLF and CR as LF; a CR at the end may be half of a CRLF and waits for the next chunk."""
    if b"\r" not in buffer:
        return buffer
    held = buffer.endswith(b"\r")
    body = (buffer[:-1] if held else buffer).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return body + b"\r" if held else body


async def events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, str]]:
    buffer = b""
    async for chunk in response.content.iter_any():
        *blocks, buffer = _lf(buffer + chunk).split(b"\n\n")
        for block in blocks:
            if (message := _message(block)) is not None:
                yield message
    if (message := _message(buffer.replace(b"\r", b"\n"))) is not None:
        yield message


async def refusal(response: aiohttp.ClientResponse) -> tuple[str, str] | None:
    """(error kind, body) of a refused request, None for a 2xx."""
    if response.status < 300:
        return None
    return f"http_{response.status}", await response.text()
