"""Publishing (docs/design.md §1 step 5): each engine step's output becomes one pipeline of writes
(conveyor/worker/publisher.py); jobs that ended leave the worker, jobs another worker took are dropped. While
Redis is down the step is retried whole — every write in it is idempotent — and the engine keeps
computing; its outputs wait in the queue, in order."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from conveyor.wire.job import JobEvent
from conveyor.worker.engine_thread import StepOutput
from conveyor.worker.outage import until_up
from conveyor.worker.owned import InFlight, Owned
from conveyor.worker.publisher import Publisher
from conveyor.worker.translate import refused, to_job_event

log = logging.getLogger(__name__)


class PublishLoop:
    def __init__(self, publisher: Publisher, owned: Owned, outputs: asyncio.Queue[StepOutput],
                 room: asyncio.Event, lose: Callable[[InFlight], None], outage_cap: float,
                 on_redis_error: Callable[[BaseException], object] | None = None) -> None:
        self.publisher = publisher
        self.owned = owned
        self.outputs = outputs
        self.room = room  # set after each step's output: the engine may have room again
        self.lose = lose
        self.outage_cap = outage_cap
        self.on_redis_error = on_redis_error

    async def run(self) -> None:
        while True:
            output = await self.outputs.get()
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
            if items:
                await self._publish(items)
            self.outputs.task_done()
            self.room.set()

    async def _publish(self, items: list[tuple[InFlight, JobEvent]]) -> None:
        published = await until_up("publish", lambda: self.publisher.publish(items), self.outage_cap,
                                   self.on_redis_error)
        for job in published.ended:
            self.owned.forget(job.job_id)
        for job in published.lost:
            self.lose(job)
