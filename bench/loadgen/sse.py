"""Server-Sent Events from an httpx response: (event, data) per message, comments skipped, whatever
the network chunking (a keep-alive comment alone in a chunk included)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx


async def events(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    event, data = "message", []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
    if data:
        yield event, "\n".join(data)


async def check_status(response: httpx.Response) -> str | None:
    """The error kind of a refused request (its body read), None for a 2xx."""
    if response.status_code < 300:
        return None
    await response.aread()
    return f"http_{response.status_code}"
