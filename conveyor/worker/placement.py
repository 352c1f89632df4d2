"""A worker's side of prefix-affinity placement (conveyor/jobqueue/placement.py, docs/design.md §3).

With `affinity` on, a worker has an own stream in each shard (Keys.own_stream, listed in the shard's
owners set) and, with every heartbeat, publishes the summary of its prefix cache, taken on the engine
thread between two steps. Whatever its setting, a worker knows the other owners (read with the
heartbeat) so that it can take their jobs that waited `affinity_wait_ms` unread (the READ script:
their owner is full, hung or dead) and reclaim their pending entries like any stream's; and it cleans
up after an owner whose heartbeat is gone, deleting its streams once they are empty (FORGET).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from conveyor.jobqueue.keys import WORKER_GROUP, Keys
from conveyor.jobqueue.placement import SUMMARY_MAX_BLOCKS, encode_summary
from conveyor.jobqueue.queue import read_owners
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.worker.engine_thread import EngineThread

log = logging.getLogger(__name__)


class WorkerAffinity:
    def __init__(self, redis: Redis, keys: Keys, scripts: Scripts, worker_id: str, enabled: bool,
                 wait_ms: int, lease_ms: int, block_size: int) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = scripts
        self.worker_id = worker_id
        self.enabled = enabled
        self.wait_ms = wait_ms
        self.lease_ms = lease_ms
        self.block_size = block_size
        self._others: list[str] = []  # the other owners, as of the last heartbeat

    def own(self, shard: int) -> list[str]:
        """This worker's own stream in the shard, read before the bands (none with affinity off)."""
        return [self.keys.own_stream(shard, self.worker_id)] if self.enabled else []

    def others(self, shard: int) -> list[str]:
        """The other owners' streams in the shard: their jobs that waited too long are anyone's."""
        return [self.keys.own_stream(shard, worker) for worker in self._others]

    def streams(self) -> list[str]:
        """Every owner's stream in every shard, this worker's included: reclaim sweeps them too."""
        return [s for shard in range(self.keys.jobs_shards) for s in self.own(shard) + self.others(shard)]

    async def register(self) -> None:
        """Creates this worker's own streams (with the group) and lists it among the owners."""
        if not self.enabled:
            return
        pipe = self.redis.pipeline(transaction=False)
        for shard in range(self.keys.jobs_shards):
            own = self.keys.own_stream(shard, self.worker_id)
            pipe.xgroup_create(own, WORKER_GROUP, id="0", mkstream=True)
            pipe.sadd(self.keys.owners(shard), self.worker_id)
        for result in await pipe.execute(raise_on_error=False):
            if isinstance(result, Exception) and not (isinstance(result, ResponseError)
                                                      and "BUSYGROUP" in str(result)):
                raise result

    async def beat(self, thread: EngineThread, timeout_s: float) -> None:
        """With the heartbeat: publish the prefix-cache summary, re-read the owners, clean up after
        the gone ones."""
        if self.enabled:
            hashes: list[int] | None = None
            # An engine step longer than that: publish next time. Not wait_for: on Python 3.11 it
            # returns the result when the task is cancelled just as the summary arrives (a worker's
            # stop), and the heartbeat loop then never ended.
            with suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    hashes = await thread.cached_prefixes(SUMMARY_MAX_BLOCKS)
            if hashes is not None:
                summary = encode_summary(self.block_size, hashes)
                await self.redis.set(self.keys.prefixes(self.worker_id), summary, px=self.lease_ms)
        owners = sorted(set().union(*await read_owners(self.redis, self.keys)) - {self.worker_id})
        self._others = owners
        if not owners:
            return
        # One read of the heartbeat index says who beat within a lease (by this host's clock); only
        # the others' heartbeat keys are read, one by one, before their streams are forgotten.
        since = time.time() - self.lease_ms / 1000
        beating = set(await self.redis.zrangebyscore(self.keys.worker_beats, since, "+inf"))
        quiet = [w for w in owners if w not in beating]
        alive = [bool(n) for n in await self._exist([self.keys.worker(w) for w in quiet])]
        gone = [w for w, live in zip(quiet, alive, strict=True) if not live]
        if gone:
            await self._forget(gone)

    async def withdraw(self) -> None:
        """At the start of a drain: the api places no more jobs here (it reads the summaries)."""
        if self.enabled:
            await self.redis.delete(self.keys.prefixes(self.worker_id))

    async def leave(self) -> None:
        """At the end of a drain: the own streams go if they are empty (what is left in them others
        take after `affinity_wait_ms`, and delete them afterwards)."""
        if self.enabled:
            await self.redis.delete(self.keys.prefixes(self.worker_id))
            await self._forget([self.worker_id])

    async def _exist(self, keys: list[str]) -> list[int]:
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:  # one key per command (cluster)
            pipe.exists(key)
        return list(await pipe.execute()) if keys else []

    async def _forget(self, workers: list[str]) -> None:
        def build(pipe) -> None:  # type: ignore[no-untyped-def]
            for worker in workers:
                for shard in range(self.keys.jobs_shards):
                    streams = [self.keys.own_stream(shard, worker), self.keys.owners(shard)]
                    self.scripts.call(pipe, "forget", streams, [WORKER_GROUP, worker])

        results = await self.scripts.execute(build)
        for result in results:
            if isinstance(result, Exception):
                raise result
        shards = self.keys.jobs_shards
        done = {w for i, w in enumerate(workers) if all(results[i * shards:(i + 1) * shards])}
        self._others = [w for w in self._others if w not in done]
        if any(results):
            log.info("removed the empty own stream(s) of gone worker(s) %s", ", ".join(workers))
