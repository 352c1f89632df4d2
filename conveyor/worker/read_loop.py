"""Taking jobs (docs/design.md §1 step 3): up to n entries (conveyor/worker/queue_reader.py: highest band
first, shards in turn), n being what the engine can admit now, so a busy worker stops reading and the
others take the queue; each entry read (or reclaimed by
the lease loop) is admitted: owned, taken (intake), then added to the engine in one go."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import suppress

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.queue import Entry, ensure_group
from conveyor.worker import faults
from conveyor.worker.engine_thread import EngineThread
from conveyor.worker.intake import Intake, parse
from conveyor.worker.lease import Lease
from conveyor.worker.owned import InFlight, Owned
from conveyor.worker.placement import WorkerAffinity
from conveyor.worker.queue_reader import QueueReader


class ReadLoop:
    def __init__(self, redis: Redis, keys: Keys, worker_id: str, thread: EngineThread, intake: Intake,
                 lease: Lease, owned: Owned, draining: Callable[[], bool], crash_token: int | None,
                 queue: QueueReader, affinity: WorkerAffinity, placed: Callable[[str], None]) -> None:
        self.redis = redis
        self.keys = keys
        self.worker_id = worker_id
        self.thread = thread
        self.intake = intake
        self.lease = lease
        self.owned = owned
        self.draining = draining
        self.room = asyncio.Event()  # set when the engine may have room for more jobs
        self._crash_token = crash_token  # test-only fault injection (conveyor/worker/faults.py)
        self.queue = queue
        self.affinity = affinity
        self.placed = placed  # counts each entry read by its placement outcome

    async def run(self) -> None:
        while not self.draining():
            try:
                entries = await self._read()
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await ensure_group(self.redis, self.keys)  # a stream was deleted under us
                await self.affinity.register()  # (our own: the fleet thought we were gone)
                continue
            except asyncio.CancelledError:
                self.queue.cancel()
                raise
            if self.draining():  # read while the drain began: hand them straight back
                entries += await self.queue.settle()
                await self.lease.release([e.ref for e in entries])
                return
            for entry in entries:
                self.placed(self._outcome(entry.stream))
            await self.admit(entries)
        await self.lease.release([e.ref for e in await self.queue.settle()])

    def _outcome(self, stream: str) -> str:
        """affinity_hit: from our own stream; stolen: from another worker's; shared: the bands."""
        own = {s for shard in range(self.keys.jobs_shards) for s in self.affinity.own(shard)}
        if stream in own:
            return "affinity_hit"
        return "stolen" if ":w:" in stream.rsplit("}", 1)[-1] else "shared"

    async def _read(self) -> list[Entry]:
        """What to admit next: entries a blocking read returned meanwhile (pending for this worker
        already: they run whatever the room, the engine queues them), else as many as there is room for."""
        if done := self.queue.harvest():
            return done
        room = self.thread.capacity()
        if room <= 0:
            # Capacity is 0 while the engine has a job waiting for room, so that the shared streams'
            # jobs go to workers that have it. Jobs on our own stream were placed here for the
            # prefix we hold: still take them while batch slots are free (the engine queues them;
            # their prefill is mostly cached), rather than let another take them after
            # affinity_wait_ms and compute their prefix anew. Polled in time for that bound.
            if self.affinity.enabled and (slots := self.thread.free_slots()) > 0 and \
                    (own := await self.queue.poll_own(slots)):
                return own
            self.queue.touch()  # the blocking reads may not be in flight meanwhile: poll once there is room
            self.room.clear()
            # (at least 10 ms: a 1 ms bound must not turn this into a busy loop of reads)
            timeout = min(0.5, max(0.01, self.affinity.wait_ms / 2000)) if self.affinity.enabled else 0.5
            with suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # (wait_for may drop a cancel on Python 3.11)
                    await self.room.wait()
            return []
        if self.queue.stale() and (entries := await self.queue.poll(room)):
            return entries
        return await self.queue.wait(room)

    async def admit(self, entries: list[Entry]) -> None:
        jobs = []
        for entry in entries:
            spec = parse(entry)
            if isinstance(spec, str):
                await self.intake.drop(entry, spec)
                continue
            if spec.id in self.owned:  # our own entry, reclaimed while it runs here: keep running
                continue
            job = InFlight(spec.id, entry.entry_id, spec.created_at, entry.deliveries, spec=spec,
                           stream=entry.stream)
            self.owned.add(job)  # before taking it, so a cancel meanwhile is not missed
            jobs.append((job, spec, entry))
        if not jobs:
            return
        started: set[str] = set()
        try:
            commands = await self.intake.decide(await self.intake.take(jobs))
            for command in commands:
                faults.maybe_crash(self._crash_token, command.prompt_ids)
            if commands:
                self.thread.add(*commands)  # together: they all join the engine's next step
            for command in commands:
                started.add(command.request_id)
                if (owned := self.owned.get(command.request_id)) is not None and owned.cancel_requested:
                    self.thread.abort(command.request_id)
        finally:
            for job, _spec, _entry in jobs:
                if job.job_id not in started:
                    self.owned.forget(job.job_id)
