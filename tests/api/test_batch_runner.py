"""The api's batch runner stops even when its cancel is lost (conveyor/api/batch/runner.py): on
Python 3.11 a cancel that lands as a redis-py command's socket write completes is dropped by
`asyncio.wait_for`, and a runner that waited on the cancel alone held the api's shutdown until it was
killed (30 s a stop in the test suite)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from conveyor.api.batch.runner import BatchRunner
from conveyor.jobqueue.keys import Keys
from conveyor.settings import Settings


async def test_a_runner_whose_cancel_is_lost_still_stops(redis) -> None:  # type: ignore[no-untyped-def]
    jobs = SimpleNamespace(redis=redis, keys=Keys("batchrunner"))
    runner = BatchRunner(SimpleNamespace(jobs=jobs, settings=Settings()))  # type: ignore[arg-type]
    ticking = asyncio.Event()
    lost = []

    async def tick_that_loses_a_cancel() -> None:
        ticking.set()
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if lost:
                raise
            lost.append(True)  # dropped once, as wait_for does: the task stays "cancelling", goes on

    runner.tick = tick_that_loses_a_cancel  # type: ignore[method-assign]
    runner.start()
    await asyncio.wait_for(ticking.wait(), 10)
    stopping = asyncio.create_task(runner.stop())
    done, _ = await asyncio.wait({stopping}, timeout=10)
    if not done and runner._task is not None:
        runner._task.cancel()  # a second cancel is honoured: the test ends either way
    assert stopping in done, "stop() waited on a runner whose cancel was lost"
    assert lost == [True]
