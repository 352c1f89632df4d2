"""The heartbeat (docs/design.md §1 step 8): every `heartbeat_interval_ms` a worker renews the leases
of the jobs it owns, writes its heartbeat key, re-reads its jobs' cancel flags, and, if it is the
fleet's sweeper (conveyor/worker/lease.py), sweeps the group for jobs whose worker died or hung.

Renewing comes first in every round, and the runner restarts this loop after every Redis failure,
so the first thing a worker does when Redis is back is renew its own leases; it sweeps for others'
jobs only from its second round on, a heartbeat later, when their owners have renewed theirs. Rounds
keep a fixed rate: one that an outage held up is followed at once by the next renewal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from conveyor.jobqueue.queue import Entry
from conveyor.wire.heartbeat import WorkerInfo
from conveyor.worker.control_loop import ControlLoop
from conveyor.worker.engine_thread import EngineThread
from conveyor.worker.lease import Lease
from conveyor.worker.observe import Observer
from conveyor.worker.owned import InFlight, Owned
from conveyor.worker.placement import WorkerAffinity


class LeaseLoop:
    def __init__(self, lease: Lease, owned: Owned, thread: EngineThread, control: ControlLoop,
                 admit: Callable[[list[Entry]], Awaitable[None]], info: Callable[[], WorkerInfo],
                 observer: Observer, lose: Callable[[InFlight], None], draining: Callable[[], bool],
                 interval_s: float, affinity: WorkerAffinity) -> None:
        self.lease = lease
        self.owned = owned
        self.thread = thread
        self.control = control
        self.admit = admit
        self.info = info
        self.observer = observer
        self.lose = lose
        self.draining = draining
        self.interval_s = interval_s
        self.affinity = affinity

    async def run(self) -> None:
        self.lease.forget_suspects()  # what a sweep saw before an outage says nothing now
        sweep = False
        while True:
            began = time.monotonic()
            await self._renew()
            await self.lease.beat(self.info())
            if not self.draining():
                await self.affinity.beat(self.thread, self.interval_s)
            await self.control.check_flags()
            if sweep:
                await self._sweep()
            sweep = True
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - began)))

    async def _sweep(self) -> None:
        """The sweeper's turn is held for two heartbeats: a dead sweeper's is free again before any
        lease of its jobs runs out (heartbeat_interval_ms is at most a third of job_lease_ms)."""
        room = 0 if self.draining() else self.thread.capacity()
        if not await self.lease.sweeps(room > 0, int(self.interval_s * 2000)):
            self.lease.forget_suspects()  # another's sweeps: ours, if we sweep again, start over
            return
        entries = await self.lease.reclaim(room)
        if entries:
            self.observer.reclaimed(len(entries))
            await self.admit(entries)

    async def _renew(self) -> None:
        jobs = self.owned.jobs()
        lost = await self.lease.renew([job.ref for job in jobs])
        for job in jobs:
            # An ended job's entry may have been acknowledged while the renewal ran: not lost.
            if job.ref in lost and not job.ended and self.owned.get(job.job_id) is job:
                self.lose(job)
