"""One write per wake-up (conveyor/api/responses/sse.py, `together`): chunks rendered without a wait
between them go out joined, in order; an error ends the stream after what came before it; a stream
that stops early stops its rendering (whose cleanup cancels the job)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from conveyor.api.responses.sse import together


async def test_chunks_rendered_in_one_wake_up_are_one_write() -> None:
    arrivals: asyncio.Queue[list[str]] = asyncio.Queue()

    async def chunks() -> AsyncIterator[str]:
        while (batch := await arrivals.get()):
            for chunk in batch:  # a message's events: rendered with no wait between them
                yield chunk

    for batch in (["a", "b", "c"], ["d"], ["e", "f"], []):
        arrivals.put_nowait(batch)
    writes = [write async for write in together(chunks())]
    assert "".join(writes) == "abcdef"
    assert len(writes) < 6  # not one write per chunk

    for batch in (["a", "b", "c"], []):
        arrivals.put_nowait(batch)
    assert [write async for write in together(chunks())] == ["abc"]


async def test_an_error_comes_after_the_chunks_before_it() -> None:
    async def chunks() -> AsyncIterator[str]:
        yield "a"
        yield "b"
        raise ValueError("relay gave up")

    writes: list[str] = []
    with pytest.raises(ValueError, match="relay gave up"):
        async for write in together(chunks()):
            writes.append(write)
    assert "".join(writes) == "ab"


async def test_a_stream_closed_early_stops_its_rendering() -> None:
    cleaned = asyncio.Event()

    async def chunks() -> AsyncIterator[str]:
        try:
            for i in range(1000):
                yield str(i)
                await asyncio.sleep(0)
        finally:
            cleaned.set()  # where follow() cancels the job of a client that went away

    stream = together(chunks(), most=4)
    first = await anext(stream)
    await stream.aclose()
    await asyncio.wait_for(cleaned.wait(), 10)
    assert first.startswith("0")
