"""A small SSE reader for tests: (id, data) pairs of a text/event-stream response."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx


def events(response: httpx.Response) -> Iterator[tuple[int | None, dict]]:
    event_id: int | None = None
    for line in response.iter_lines():
        if line.startswith("id:"):
            event_id = int(line[3:].strip())
        elif line.startswith("data:"):
            yield event_id, json.loads(line[5:])
            event_id = None
