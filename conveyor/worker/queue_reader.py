"""Reading the queue (docs/design.md §1 step 3, §3): jobs_shards × priority bands, by capacity.

`poll(room)` takes up to `room` new entries without waiting: shard by shard (each read starts at the
next shard), and inside a shard band by band in `read_order` (highest first; every Kth read one band
lower, so low bands keep moving), one READ script per shard — a shard's bands share a hash tag, so
that is one slot and one round trip, and it takes exactly what was asked, never one entry per stream
more.

`wait(room)` blocks until something arrives when every stream was empty: one blocking XREADGROUP per
shard over that shard's bands, all in flight at once (one connection each), so an entry on any shard
wakes the worker as soon as it is written — no polling interval, no latency added. A blocking read
cannot be cancelled safely (Redis may have delivered entries the reply to which would be lost, to be
reclaimed only a lease later), so reads still in flight when one returns are left to finish; what they
read is collected by the next `harvest()`, or by `settle()` at the drain.

Prefix affinity (conveyor/worker/placement.py): a shard's read starts with this worker's own stream, and ends
with the other workers' own streams, from which it takes only entries that waited `affinity_wait_ms`
unread. A blocking read cannot see those ripen, so while other owners exist `wait` returns in time to
poll again when the next one is due (or every `affinity_wait_ms`): a job placed on a full, hung or
dead worker waits at most about `affinity_wait_ms` plus one read.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from conveyor.jobqueue.bands import read_order, shard_order
from conveyor.jobqueue.keys import WORKER_GROUP, Keys
from conveyor.jobqueue.queue import Entry
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.worker.placement import WorkerAffinity

READ_BLOCK_MS = 1000


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
        self._due_s: float | None = None  # when the next entry of another's stream may be taken
        self._seen: dict[int, str] = {}  # shard → the last entry of our own stream delivered to anyone
        self.reads = 0  # polls so far: where the band rotation and the shard turn stand
        # shard → its blocking read in flight; (shard, "own") → the doorbell of our own stream
        self._waits: dict[int | tuple[int, str], asyncio.Task[list[Entry]]] = {}
        self._carry: list[Entry] = []  # read by a blocking read, not yet returned (another one failed)

    async def poll(self, room: int) -> list[Entry]:
        """Up to `room` new entries, highest band first (with the starvation rule), shards in turn."""
        bands = read_order(self.reads, self.starvation_every)
        shards = shard_order(self.reads, self.keys.jobs_shards)
        self.reads += 1
        out: list[Entry] = []
        wait_ms = self.affinity.wait_ms
        due = [wait_ms] if any(self.affinity.others(shard) for shard in shards) else []
        for shard in shards:
            if len(out) >= room:
                break
            first = self.affinity.own(shard) + list(self.keys.shard_streams(shard, bands))
            streams = first + self.affinity.others(shard)
            left = room - len(out)

            own = int(bool(self.affinity.own(shard)))

            args = [WORKER_GROUP, self.worker_id, left, len(first), wait_ms, own]

            def build(pipe, streams: list[str] = streams, args: list[object] = args) -> None:  # type: ignore[no-untyped-def]
                self.scripts.call(pipe, "read", streams, args)

            (reply,) = await self.scripts.execute(build)
            if isinstance(reply, Exception):
                raise reply
            read, soonest, seen = reply
            if seen:
                self._seen[shard] = seen
            for stream, items in read:
                out += _entries(stream, items)
            if int(soonest) >= 0:
                due.append(int(soonest))
        self._due_s = max(0.005, min(due) / 1000) if due else None
        return out

    async def poll_own(self, room: int) -> list[Entry]:
        """Up to `room` new entries of this worker's own streams only, without waiting: one
        XREADGROUP per shard (one key each: cluster-safe)."""
        out: list[Entry] = []
        for shard in range(self.keys.jobs_shards):
            if len(out) >= room or not (own := self.affinity.own(shard)):
                continue
            reply = await self.redis.xreadgroup(WORKER_GROUP, self.worker_id, {own[0]: ">"},
                                                count=room - len(out))
            entries = [entry for stream, items in reply or [] for entry in _entries(stream, items)]
            if entries:
                self._seen[shard] = entries[-1].entry_id  # the doorbell rings for later ones only
            out += entries
        return out

    async def wait(self, room: int) -> list[Entry]:
        """Blocks until any shard has new entries (at most READ_BLOCK_MS, or until an entry of another
        worker's own stream is due); returns what came first."""
        for shard in range(self.keys.jobs_shards):
            if shard not in self._waits:
                self._waits[shard] = asyncio.create_task(self._block(shard, room), name=f"read-shard-{shard}")
            if self.affinity.own(shard) and (shard, "own") not in self._waits:
                self._waits[shard, "own"] = asyncio.create_task(self._doorbell(shard), name=f"bell-{shard}")
        # (a timeout leaves the blocking reads in flight: the next wait or harvest collects them)
        await asyncio.wait(self._waits.values(), timeout=self._due_s, return_when=asyncio.FIRST_COMPLETED)
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
        reply = await self.redis.xreadgroup(WORKER_GROUP, self.worker_id, streams, count=room,  # type: ignore[arg-type]
                                            block=READ_BLOCK_MS)
        return [entry for stream, items in reply or [] for entry in _entries(stream, items)]

    async def _doorbell(self, shard: int) -> list[Entry]:
        """Wakes the worker when its own stream gets an entry after the last one delivered. An XREAD,
        not a group read: a worker stopped while it waits (SIGSTOP, a long GC) is delivered nothing,
        so a job placed on it stays unread, and others take it after affinity_wait_ms."""
        own = self.affinity.own(shard)[0]
        await self.redis.xread({own: self._seen.get(shard, "$")}, count=1, block=READ_BLOCK_MS)
        return []
