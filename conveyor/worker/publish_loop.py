"""Publishing (docs/design.md §1 step 5): each engine step's output becomes one pipeline of writes
(conveyor/worker/publisher.py) on two paths (conveyor/worker/coalesce.py): the live one, the tokens
of followed jobs every stream interval, and the durable one, every job's events every durable
interval; jobs that ended leave the worker, jobs another worker took are dropped.
While Redis is down the step is retried whole — every write in it is idempotent — and the engine keeps
computing; its outputs wait in the queue, in order."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from conveyor.worker.coalesce import Coalescer, Item
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
                 stream_interval_s: float = 0.0, durable_interval_s: float = 0.0) -> None:
        self.publisher = publisher
        self.owned = owned
        self.outputs = outputs
        self.room = room  # set after each step's output: the engine may have room again
        self.lose = lose
        self.outage_cap = outage_cap
        self.on_redis_error = on_redis_error
        self.live = Coalescer(stream_interval_s)
        self.durable = Coalescer(max(stream_interval_s, durable_interval_s))
        self._writing = asyncio.Lock()  # a job's batches are written in order, also by flush()

    async def run(self) -> None:
        while True:
            output = await self._next_output()
            if output is None:  # held events ran out of their interval with no step
                await self._publish(self.durable.due(), self.live.due())
                continue
            items: list[Item] = []
            for event in output.events:
                job = self.owned.get(event.request_id)
                if job is not None:  # else: lost or handed off; its new owner publishes
                    items.append((job, to_job_event(event, job.choices)))
            for job_id, reason in output.rejected:
                job = self.owned.get(job_id)
                if job is not None:
                    log.error("job %s refused by the engine: %s", job_id, reason)
                    items.append((job, refused(job, reason)))
            live = self.live.step([(job, event) for job, event in items if job.followed])
            await self._publish(self.durable.step(items), live)
            self.outputs.task_done()
            self.room.set()

    async def flush(self) -> None:
        """Writes every held event now (the worker drains, then hands its unfinished jobs over)."""
        await self._publish(self.durable.take_all(), self.live.take_all())

    def followed(self, job: InFlight) -> None:
        """An api started following the job (or lost some of its live events): what its event stream
        lacks is written at once, so the relay can fill from there what it did not see live (its
        tokens go out live to the api from the next step on: the caller added it to the followers)."""
        self.durable.expedite(job.job_id)

    async def _next_output(self) -> StepOutput | None:
        dues = [due for due in (self.durable.next_due(), self.live.next_due()) if due is not None]
        due = min(dues) if dues else None
        if due is None:
            return await self.outputs.get()
        try:  # not wait_for: on Python 3.11 it may drop a cancel that lands as the get completes
            async with asyncio.timeout(max(0.0, due - time.monotonic())):
                return await self.outputs.get()
        except TimeoutError:
            return None

    async def _publish(self, durable: list[Item], live: list[Item]) -> None:
        durable = [(job, event) for job, event in durable if job.job_id in self.owned]  # not lost meanwhile
        live = [(job, event) for job, event in live if job.job_id in self.owned]
        if not durable and not live:
            return
        async with self._writing:
            published = await until_up("publish", lambda: self.publisher.publish(durable, live),
                                       self.outage_cap, self.on_redis_error)
        for job in published.ended:
            self.live.drop(job.job_id)
            self.owned.forget(job.job_id)
        for job in published.lost:
            self.durable.drop(job.job_id)
            self.live.drop(job.job_id)
            self.lose(job)
