"""`conveyor bench`'s SSE parser: the same messages whatever the network chunking and line endings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from conveyor.bench.sse import events

STREAM = (": keep-alive\n\n"
          "data: {\"text\": \"caf\u00e9 \u2603\"}\n\n"
          "event: error\ndata: line one\ndata: line two\n\n"
          ": a comment alone\n\n"
          "id: 7\ndata:no space\n\n"
          "data: [DONE]\n\n").encode()
WANT = [("message", '{"text": "caf\u00e9 \u2603"}'), ("error", "line one\nline two"),
        ("message", "no space"), ("message", "[DONE]")]


def response(chunks: list[bytes]) -> SimpleNamespace:
    async def iter_any() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk
    return SimpleNamespace(content=SimpleNamespace(iter_any=iter_any))


def parse(chunks: list[bytes]) -> list[tuple[str, str]]:
    async def collect() -> list[tuple[str, str]]:
        return [m async for m in events(response(chunks))]  # type: ignore[arg-type]
    return asyncio.run(collect())


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_every_chunking_and_line_ending_gives_the_same_messages(ending: bytes) -> None:
    body = STREAM.replace(b"\n", ending)
    assert parse([body]) == WANT
    assert parse([body[i:i + 1] for i in range(len(body))]) == WANT  # a byte at a time: splits a
    # CRLF, a UTF-8 character and the blank line between messages
    for cut in range(1, len(body)):
        assert parse([body[:cut], body[cut:]]) == WANT


def test_a_last_message_without_its_blank_line_still_counts() -> None:
    assert parse([b"data: a\n\ndata: b"]) == [("message", "a"), ("message", "b")]
    assert parse([b"data: a\r"]) == [("message", "a")]
    assert parse([b": only a comment\n\n"]) == []
