"""Ownership of jobs across a fleet (docs/design.md §1 step 8).

A job read from the consumer group is pending for its worker until acknowledged; its idle time is
the lease. A live worker renews its jobs' leases at every heartbeat (an XCLAIM to itself, only of
entries still its own), so a long generation is never taken over; one worker at a time (the sweeper,
`sweeps`: it holds Keys.sweeper for two heartbeats and renews it at each of its own) sweeps the
group on every jobs stream for entries idle past the lease at two sweeps in a row — their worker
died or hung — and resumes them: the fleet's sweep costs one XPENDING per stream per heartbeat,
whatever its size. The heartbeat key (a TTL of one lease) says who is alive and how loaded it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from conveyor.jobqueue.keys import WORKER_GROUP, Keys
from conveyor.jobqueue.queue import Entry, EntryRef, by_stream
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.wire.heartbeat import WorkerInfo

log = logging.getLogger(__name__)

BEATS_KEPT_S = 3600  # a worker gone this long leaves the heartbeat index (it counts as dead long before)


class Lease:
    def __init__(self, redis: Redis, keys: Keys, scripts: Scripts, worker_id: str, lease_ms: int,
                 own_streams: Callable[[], list[str]] = list) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = scripts
        self.worker_id = worker_id
        self.lease_ms = lease_ms
        self.own_streams = own_streams  # the workers' own streams (conveyor/worker/placement.py), swept too
        self._suspects: list[EntryRef] = []  # entries the last sweep saw idle past the lease

    async def beat(self, info: WorkerInfo) -> None:
        await self.redis.set(self.keys.worker(self.worker_id), info.model_dump_json(), px=self.lease_ms)
        # (its own command: on a cluster the index lives in another slot than the heartbeat key)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(self.keys.worker_beats, {self.worker_id: info.heartbeat_at})
        pipe.zremrangebyscore(self.keys.worker_beats, "-inf", info.heartbeat_at - BEATS_KEPT_S)
        pipe.expire(self.keys.worker_beats, int(BEATS_KEPT_S))  # gone with the last worker
        await pipe.execute()

    async def leave(self) -> None:
        await self.redis.delete(self.keys.worker(self.worker_id))
        await self.redis.zrem(self.keys.worker_beats, self.worker_id)
        await self.sweeps(False, 0)  # another worker sweeps from its next heartbeat on

    async def sweeps(self, want: bool, ttl_ms: int) -> bool:
        """Whether this worker sweeps this round: it holds the sweeper's turn, or took it (`want`: it
        has room and does not drain; else it gives the turn up)."""
        args = [self.worker_id, ttl_ms, int(want)]
        (result,) = await self.scripts.execute(
            lambda pipe: self.scripts.call(pipe, "sweep", [self.keys.sweeper], args))
        if isinstance(result, Exception):
            raise result
        return bool(result)

    async def renew(self, refs: list[EntryRef]) -> set[EntryRef]:
        """Reset the idle time of entries still pending for this worker; returns those it lost."""
        return await self._keep("renew", refs)

    async def release(self, refs: list[EntryRef]) -> None:
        """Hand entries to the fleet now: idle past the lease, this delivery not counted."""
        lost = await self._keep("release", refs)
        if lost:
            log.info("%d job(s) had already been taken over by other workers", len(lost))

    async def _keep(self, mode: str, refs: list[EntryRef]) -> set[EntryRef]:
        streams = by_stream(refs)
        if not streams:
            return set()

        def build(pipe) -> None:  # type: ignore[no-untyped-def]
            for stream, entry_ids in streams.items():  # one script call per stream: one key each
                self.scripts.call(pipe, "keep", [stream], [WORKER_GROUP, self.worker_id, mode, self.lease_ms,
                                                           *entry_ids])

        lost: set[EntryRef] = set()
        for stream, result in zip(streams, await self.scripts.execute(build), strict=True):
            if isinstance(result, Exception):
                raise result
            lost.update((stream, entry_id) for entry_id in result)
        return lost

    def forget_suspects(self) -> None:
        """After an outage, what the last sweep saw is stale: start over."""
        self._suspects = []

    async def reclaim(self, count: int) -> list[Entry]:
        """Claim up to `count` entries idle past the lease at the previous sweep and still now, over
        every jobs stream (each shard and band).

        Redis counts idle time by its own clock, which runs on through an outage (or a pause of
        Redis itself): right after one, every live worker's jobs look abandoned until their owners
        renew them, which each does first when Redis is back. So one sighting is not enough: an entry
        seen idle past the lease becomes a suspect, and is claimed (XCLAIM with the lease as minimum
        idle time, so one renewed meanwhile stays with its owner) only at the next sweep, a heartbeat
        later. A dead worker's jobs wait one heartbeat more; a live one's are never taken."""
        suspects, self._suspects = by_stream(self._suspects[:count]), []
        claimed: list[tuple[str, str, dict[str, str]]] = []
        if suspects:
            pipe = self.redis.pipeline(transaction=False)
            for stream, entry_ids in suspects.items():
                pipe.xclaim(stream, WORKER_GROUP, self.worker_id, self.lease_ms, entry_ids)  # type: ignore[arg-type]
            replies_of = _replies(await pipe.execute(raise_on_error=False))
            for stream, replies in zip(suspects, replies_of, strict=True):
                # A suspect deleted from the stream meanwhile comes back empty: nothing to run.
                claimed += [(stream, entry_id, fields) for entry_id, fields in replies if entry_id and fields]
        pipe = self.redis.pipeline(transaction=False)
        streams = [*self.keys.jobs_streams, *self.own_streams()]
        for stream in streams:
            pipe.xpending_range(stream, WORKER_GROUP, "-", "+", count, idle=self.lease_ms)
        sightings: list[list[dict[str, Any]]] = _replies(await pipe.execute(raise_on_error=False))
        self._suspects = [(stream, row["message_id"]) for stream, rows in zip(streams, sightings, strict=True)
                          for row in rows]
        if not claimed:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for stream, entry_id, _fields in claimed:
            pipe.xpending_range(stream, WORKER_GROUP, entry_id, entry_id, 1)
        pending = await pipe.execute()
        out: list[Entry] = []
        for (stream, entry_id, fields), rows in zip(claimed, pending, strict=True):
            if rows and rows[0]["consumer"] == self.worker_id:
                out.append(Entry(stream, entry_id, fields, int(rows[0]["times_delivered"])))
        if out:
            log.warning("reclaimed %d job(s) idle for more than %d ms at two sweeps in a row", len(out),
                        self.lease_ms)
        return out


def _replies(results: list[Any]) -> list[Any]:
    """A pipeline's replies, a stream gone meanwhile (a gone worker's own stream, deleted by the fleet
    once empty: conveyor/worker/placement.py) read as empty; any other error raised."""
    for result in results:
        if isinstance(result, Exception) and "NOGROUP" not in str(result):
            raise result
    return [[] if isinstance(result, Exception) else result for result in results]
