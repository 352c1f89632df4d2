"""Ownership of jobs across a fleet (DESIGN.md §1 step 8).

A job read from the consumer group is pending for its worker until acknowledged; its idle time is
the lease. A live worker renews its jobs' leases at every heartbeat (an XCLAIM to itself, only of
entries still its own), so a long generation is never taken over; every worker sweeps the group
with XAUTOCLAIM for entries idle past the lease — their worker died or hung — and resumes them. The
heartbeat key (a TTL of one lease) says who is alive and how loaded it is.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis

from schemas.keys import WORKER_GROUP, Keys
from schemas.worker import WorkerInfo
from worker.intake import Entry
from worker.scripts import Scripts

log = logging.getLogger(__name__)

SCANS_PER_SWEEP = 8


class Lease:
    def __init__(self, redis: Redis, keys: Keys, scripts: Scripts, worker_id: str, lease_ms: int) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = scripts
        self.worker_id = worker_id
        self.lease_ms = lease_ms
        self._cursor = "0-0"  # where the next XAUTOCLAIM scan of the pending entries starts

    async def beat(self, info: WorkerInfo) -> None:
        await self.redis.set(self.keys.worker(self.worker_id), info.model_dump_json(), px=self.lease_ms)

    async def leave(self) -> None:
        await self.redis.delete(self.keys.worker(self.worker_id))

    async def renew(self, entry_ids: list[str]) -> set[str]:
        """Reset the idle time of entries still pending for this worker; returns those it lost."""
        return await self._keep("renew", entry_ids)

    async def release(self, entry_ids: list[str]) -> None:
        """Hand entries to the fleet now: idle past the lease, this delivery not counted."""
        lost = await self._keep("release", entry_ids)
        if lost:
            log.info("%d job(s) had already been taken over by other workers", len(lost))

    async def _keep(self, mode: str, entry_ids: list[str]) -> set[str]:
        if not entry_ids:
            return set()

        def build(pipe) -> None:  # type: ignore[no-untyped-def]
            self.scripts.call(pipe, "keep", [self.keys.jobs_stream],
                              [WORKER_GROUP, self.worker_id, mode, self.lease_ms, *entry_ids])

        (lost,) = await self.scripts.execute(build)
        if isinstance(lost, Exception):
            raise lost
        return set(lost)

    async def reclaim(self, count: int) -> list[Entry]:
        """Claim up to `count` entries idle past the lease, with their delivery counts.

        XAUTOCLAIM scans the pending entries from a cursor, about 10 × COUNT per call; the cursor
        is kept between sweeps, so a long list of healthy pending jobs costs a few calls per sweep,
        not a full scan."""
        claimed: list[tuple[str, dict[str, str]]] = []
        for _ in range(SCANS_PER_SWEEP):
            self._cursor, entries, *_deleted = await self.redis.xautoclaim(
                self.keys.jobs_stream, WORKER_GROUP, self.worker_id, self.lease_ms, self._cursor,
                count=count - len(claimed),
            )
            claimed.extend((entry_id, fields) for entry_id, fields in entries if fields)
            if self._cursor == "0-0" or len(claimed) >= count:
                break
        if not claimed:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for entry_id, _fields in claimed:
            pipe.xpending_range(self.keys.jobs_stream, WORKER_GROUP, entry_id, entry_id, 1)
        pending = await pipe.execute()
        out: list[Entry] = []
        for (entry_id, fields), rows in zip(claimed, pending, strict=True):
            if rows and rows[0]["consumer"] == self.worker_id:
                out.append(Entry(entry_id, fields, int(rows[0]["times_delivered"])))
        if out:
            log.warning("reclaimed %d job(s) idle for more than %d ms", len(out), self.lease_ms)
        return out
