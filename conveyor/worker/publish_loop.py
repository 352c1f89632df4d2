"""Publishing (docs/design.md §1 step 5): each engine step's output becomes one pipeline of writes
(conveyor/worker/publisher.py), a job's tokens held up to the stream interval to go out together
(conveyor/worker/coalesce.py); jobs that ended leave the worker, jobs another worker took are dropped.
While Redis is down the step is retried whole — every write in it is idempotent — and the engine keeps
computing; its outputs wait in the queue, in order."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from conveyor.wire.job import JobEvent
from conveyor.worker.coalesce import Coalescer
from conveyor.worker.engine_thread import StepOutput
from conveyor.worker.outage import until_up
from conveyor.worker.owned import InFlight, Owned
from conveyor.worker.publisher import Publisher
from conveyor.worker.translate import refused, to_job_event

log = logging.getLogger(__name__)


class PublishLoop:
    def __init__(self, publisher: Publisher, owned: Owned, outputs: asyncio.Queue[StepOutput],
                 room: asyncio.Event, lose: Callable[[InFlight], None], outage_cap: float,
                 on_redis_error: Callable[[BaseException], object] | None = None,
                 stream_interval_s: float = 0.0, unfollowed_interval_s: float = 0.0) -> None:
        self.publisher = publisher
        self.owned = owned
        self.outputs = outputs
        self.room = room  # set after each step's output: the engine may have room again
        self.lose = lose
        self.outage_cap = outage_cap
        self.on_redis_error = on_redis_error
        self.held = Coalescer(stream_interval_s, unfollowed_interval_s)
        self._writing = asyncio.Lock()  # a job's batches are written in order, also by flush()

    async def run(self) -> None:
        while True:
            output = await self._next_output()
            if output is None:  # held events ran out of their interval with no step
                await self._publish(self.held.due())
                continue
            items: list[tuple[InFlight, JobEvent]] = []
            for event in output.events:
                job = self.owned.get(event.request_id)
                if job is not None:  # else: lost or handed off; its new owner publishes
                    items.append((job, to_job_event(event, job.choices)))
            for job_id, reason in output.rejected:
                job = self.owned.get(job_id)
                if job is not None:
                    log.error("job %s refused by the engine: %s", job_id, reason)
                    items.append((job, refused(job, reason)))
            await self._publish(self.held.step(items))
            self.outputs.task_done()
            self.room.set()

    async def flush(self) -> None:
        """Writes every held event now (the worker drains, then hands its unfinished jobs over)."""
        await self._publish(self.held.take_all())

    async def _next_output(self) -> StepOutput | None:
        due = self.held.next_due()
        if due is None:
            return await self.outputs.get()
        try:  # not wait_for: on Python 3.11 it may drop a cancel that lands as the get completes
            async with asyncio.timeout(max(0.0, due - time.monotonic())):
                return await self.outputs.get()
        except TimeoutError:
            return None

    async def _publish(self, items: list[tuple[InFlight, JobEvent]]) -> None:
        items = [(job, event) for job, event in items if job.job_id in self.owned]  # not lost meanwhile
        if not items:
            return
        async with self._writing:
            published = await until_up("publish", lambda: self.publisher.publish(items), self.outage_cap,
                                       self.on_redis_error)
        for job in published.ended:
            self.owned.forget(job.job_id)
        for job in published.lost:
            self.held.drop(job.job_id)
            self.lose(job)
