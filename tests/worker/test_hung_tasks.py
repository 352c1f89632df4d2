"""A stopping worker cancels its loops and waits for them, but not forever: one that swallows its
cancel is logged with the chain of what it awaits and left behind (conveyor/worker/hung_tasks.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from conveyor.worker.hung_tasks import awaited_chain, cancel_all


async def swallows_its_cancel(release: asyncio.Event) -> None:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await release.wait()  # a cleanup that hangs


async def ends_when_cancelled() -> None:
    await asyncio.Event().wait()


async def test_a_task_that_will_not_end_is_logged_and_left(caplog: pytest.LogCaptureFixture) -> None:
    release = asyncio.Event()
    stubborn = asyncio.create_task(swallows_its_cancel(release), name="lease")
    polite = asyncio.create_task(ends_when_cancelled(), name="read")
    await asyncio.sleep(0)  # both start and wait
    with caplog.at_level(logging.ERROR, logger="conveyor.worker.hung_tasks"):
        hung = await cancel_all((stubborn, polite), 0.2, "worker w-1")
    assert hung == {stubborn} and polite.cancelled()
    message = caplog.records[-1].getMessage()
    assert "worker w-1: its task lease did not end" in message
    assert "in swallows_its_cancel" in message and "(cancelling)" in message
    release.set()
    await stubborn


async def test_the_chain_names_each_awaiting_coroutine() -> None:
    async def inner(event: asyncio.Event) -> None:
        await event.wait()

    async def outer(event: asyncio.Event) -> None:
        await inner(event)

    event = asyncio.Event()
    task = asyncio.create_task(outer(event), name="x")
    await asyncio.sleep(0)
    chain = awaited_chain(task).splitlines()
    assert chain[0] == "task x (pending):"
    assert [line.rsplit(" in ", 1)[1] for line in chain[1:4]] == ["outer", "inner", "wait"]
    assert chain[-1].startswith("  waits on ")
    event.set()
    await task
