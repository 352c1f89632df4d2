"""Reading the queue (docs/design.md §1 step 3, §3): jobs_shards × priority bands, by capacity.

`poll(room)` takes up to `room` new entries without waiting, band by band in `read_order` (highest
first; every Kth read one band lower, so low bands keep moving) across the whole fleet's queue: with
several shards it first counts what waits in each shard's bands (one DEPTH script per shard, in one
pipeline), gives each shard its quota of the room in band order (`fleet_quotas`), then runs one READ
script per shard (each read starts at the next shard) — a shard's bands share a hash tag, so that is
one slot and one round trip, and it takes exactly what was asked, never one entry per stream more.
So a high-priority job on one shard is taken before the low ones on another, as on a single stream.

`wait(room)` blocks until something arrives when every stream was empty: one blocking XREADGROUP per
shard over that shard's bands, all in flight at once (one connection each), so an entry on any shard
wakes the worker as soon as it is written — no polling interval, no latency added. A blocking read
cannot be cancelled safely (Redis may have delivered entries the reply to which would be lost, to be
reclaimed only a lease later), so reads still in flight when one returns are left to finish; what they
read is collected by the next `harvest()`, or by `settle()` at the drain.

Prefix affinity (conveyor/worker/placement.py): a shard's read starts with this worker's own stream, and ends
with the other workers' own streams, from which it takes only entries that waited `affinity_wait_ms`
unread. A blocking group read over every owner's stream would deliver another's job at once, so
while any owner exists `wait` also blocks on the shard's doorbell (Keys.placed, an XREAD from the
last id the worker saw), which the api rings whenever it places a job on an own stream: a job placed
on this worker, or on another one that may not take it, wakes the worker as soon as it is placed; a
poll then says when another's entry is due, and `wait` returns in time to poll again then. So a job
placed on a full, hung or dead worker waits at most about `affinity_wait_ms` plus one read, and an
idle worker sends one blocking read per shard and one XREAD per shard per READ_BLOCK_MS, whatever
the size of the fleet (`python -m benchmarks.idle_cost`).

`stale()` says when to poll before blocking: at first, after a read that returned entries or filled
the room, after the doorbell rang, and once another's entry is due. A blocking read that ends empty
means that nothing arrived: the worker blocks again without polling.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.asyncio import Redis

from conveyor.jobqueue.bands import Band, fleet_quotas, read_order, shard_order
from conveyor.jobqueue.keys import WORKER_GROUP, Keys
from conveyor.jobqueue.queue import Entry
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.worker.placement import WorkerAffinity

READ_BLOCK_MS = 1000
Reply = list[tuple[str, list[Any]]] | None  # XREADGROUP's, decoded: (stream, [(entry id, fields), ...]) each


def _entries(stream: str, items: list[Any]) -> list[Entry]:
    """Entries of one stream from a script's reply (fields as a flat list) or XREADGROUP's (a dict)."""
    out = []
    for entry_id, fields in items:
        if isinstance(fields, list):
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        out.append(Entry(stream, entry_id, fields))
    return out


class QueueReader:
    def __init__(self, redis: Redis, keys: Keys, scripts: Scripts, worker_id: str,
                 starvation_every: int, affinity: WorkerAffinity) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = scripts
        self.worker_id = worker_id
        self.starvation_every = starvation_every
        self.affinity = affinity
        self._due_at: float | None = None  # monotonic time when an entry of another's stream may be taken
        self._bell: dict[int, str] = {}  # shard → the last doorbell id seen (the READ script's, the XREAD's)
        self._stale = True  # something may be readable that no blocking read would return: poll first
        self.reads = 0  # polls so far: where the band rotation and the shard turn stand
        # shard → its blocking read in flight; (shard, "bell") → the shard's doorbell
        self._waits: dict[int | tuple[int, str], asyncio.Task[list[Entry]]] = {}
        self._carry: list[Entry] = []  # read by a blocking read, not yet returned (another one failed)

    def stale(self) -> bool:
        """Whether a poll may find what the blocking reads would not return."""
        return self._stale or (self._due_at is not None and time.monotonic() >= self._due_at)

    def touch(self) -> None:
        """Poll at the next read (the worker had no room: it did not watch the streams meanwhile)."""
        self._stale = True

    async def poll(self, room: int) -> list[Entry]:
        """Up to `room` new entries, highest band first (with the starvation rule), shards in turn."""
        bands = read_order(self.reads, self.starvation_every)
        shards = shard_order(self.reads, self.keys.jobs_shards)
        self.reads += 1
        self._stale = False
        quota = await self._quotas(shards, bands, room) if len(shards) > 1 else None
        out: list[Entry] = []
        wait_ms = self.affinity.wait_ms
        due: list[int] = []
        for i, shard in enumerate(shards):
            # the room less what the shards after this one are to give (all of it with one shard)
            count = room - len(out) - (sum(quota[s] for s in shards[i + 1:]) if quota else 0)
            if count <= 0:
                continue
            first = self.affinity.own(shard) + list(self.keys.shard_streams(shard, bands))
            streams = [self.keys.placed(shard), *first, *self.affinity.others(shard)]
            args = [WORKER_GROUP, self.worker_id, count, len(first), wait_ms]

            def build(pipe, streams: list[str] = streams, args: list[object] = args) -> None:  # type: ignore[no-untyped-def]
                self.scripts.call(pipe, "read", streams, args)

            (reply,) = await self.scripts.execute(build)
            if isinstance(reply, Exception):
                raise reply
            read, soonest, bell = reply
            self._rang(shard, bell)
            for stream, items in read:
                out += _entries(stream, items)
            if int(soonest) >= 0:
                due.append(int(soonest))
        self._due_at = time.monotonic() + max(0.005, min(due) / 1000) if due else None
        # (the doorbell may have rung meanwhile; a filled room: there may be more, on the shards not read)
        self._stale = self._stale or len(out) >= room
        return out

    async def _quotas(self, shards: tuple[int, ...], bands: tuple[Band, ...], room: int) -> dict[int, int]:
        """Each shard's share of `room`, in band order over the fleet (own streams first)."""
        def build(pipe, shards: tuple[int, ...] = shards) -> None:  # type: ignore[no-untyped-def]
            for shard in shards:
                streams = [*self.keys.shard_streams(shard, bands), *self.affinity.own(shard)]
                self.scripts.call(pipe, "depth", streams, [WORKER_GROUP])

        waiting: dict[int, tuple[int, list[int]]] = {}
        for shard, reply in zip(shards, await self.scripts.execute(build), strict=True):
            if isinstance(reply, Exception):
                raise reply
            pairs = zip(reply[::2], reply[1::2], strict=True)
            queued = [max(int(n) - int(pending), 0) for n, pending in pairs]
            waiting[shard] = (sum(queued[len(bands):]), queued[:len(bands)])
        return fleet_quotas(waiting, shards, room)

    async def poll_own(self, room: int) -> list[Entry]:
        """Up to `room` new entries of this worker's own streams only, without waiting: one
        XREADGROUP per shard (one key each: cluster-safe)."""
        out: list[Entry] = []
        for shard in range(self.keys.jobs_shards):
            if len(out) >= room or not (own := self.affinity.own(shard)):
                continue
            reply: Reply = await self.redis.xreadgroup(WORKER_GROUP, self.worker_id,  # type: ignore[assignment]
                                                       {own[0]: ">"}, count=room - len(out))
            out += [entry for stream, items in reply or [] for entry in _entries(stream, items)]
        return out

    async def wait(self, room: int) -> list[Entry]:
        """Blocks until any shard has new entries, the doorbell rings (at most READ_BLOCK_MS), or an
        entry of another worker's own stream is due; returns what came first."""
        for shard in range(self.keys.jobs_shards):
            if shard not in self._waits:
                self._waits[shard] = asyncio.create_task(self._block(shard, room), name=f"read-shard-{shard}")
            owners = self.affinity.own(shard) or self.affinity.others(shard)
            if owners and (shard, "bell") not in self._waits:
                self._waits[shard, "bell"] = asyncio.create_task(self._doorbell(shard), name=f"bell-{shard}")
        timeout = None if self._due_at is None else max(0.0, self._due_at - time.monotonic())
        # (a timeout leaves the blocking reads in flight: the next wait or harvest collects them)
        await asyncio.wait(self._waits.values(), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return self.harvest()

    def harvest(self) -> list[Entry]:
        """What the blocking reads that have ended meanwhile read (their errors raised here)."""
        out, self._carry = self._carry, []
        error: BaseException | None = None
        for shard, task in list(self._waits.items()):
            if not task.done():
                continue
            del self._waits[shard]
            if task.cancelled():
                continue
            if (exc := task.exception()) is not None:
                error = error or exc
                continue
            out += task.result()
        if out:
            self._stale = True  # a blocking read takes what it finds, not the highest band first: poll
        if error is not None:
            self._carry = out  # read and pending for this worker: the next harvest returns them
            raise error
        return out

    async def settle(self) -> list[Entry]:
        """At the drain: waits for the blocking reads in flight and returns what they read."""
        if self._waits:
            await asyncio.wait(self._waits.values())
        return self.harvest()

    def cancel(self) -> None:
        """The worker is going away now: drop the reads in flight (a lease later, others reclaim)."""
        for task in self._waits.values():
            task.cancel()
        self._waits.clear()

    async def _block(self, shard: int, room: int) -> list[Entry]:
        streams = dict.fromkeys(self.keys.shard_streams(shard), ">")
        reply: Reply = await self.redis.xreadgroup(  # type: ignore[assignment]
            WORKER_GROUP, self.worker_id, streams, count=room, block=READ_BLOCK_MS)  # type: ignore[arg-type]
        return [entry for stream, items in reply or [] for entry in _entries(stream, items)]

    async def _doorbell(self, shard: int) -> list[Entry]:
        """Returns when the api placed a job on an own stream of the shard after the last placement this
        worker saw (or after READ_BLOCK_MS). An XREAD, not a group read: a worker stopped while it waits
        (SIGSTOP, a long GC) is delivered nothing, so a job placed on it stays unread, and others take
        it after affinity_wait_ms."""
        key = self.keys.placed(shard)
        reply: Any = await self.redis.xread({key: self._bell.get(shard, "$")}, count=1, block=READ_BLOCK_MS)
        for _stream, items in reply or []:
            for entry_id, _fields in items:
                self._rang(shard, entry_id)
                self._stale = True
        return []

    def _rang(self, shard: int, entry_id: str) -> None:
        """The doorbell's last id seen, never moved back (a poll's reply may be older than an XREAD's)."""
        seen = self._bell.get(shard)
        if seen is None or _id(entry_id) > _id(seen):
            self._bell[shard] = entry_id


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
