"""The api's side of prefix-affinity placement (conveyor/jobqueue/placement.py, docs/design.md §3): on which
stream to queue a job.

The api keeps a snapshot of the fleet's prefix-cache summaries (the owners set, then one GET per
owner, with its heartbeat: its engine's prefill backlog; a worker that drains is left out),
refreshed in the background when older than half a heartbeat, so a submit never waits for it.
Between two refreshes it adds what it places on a worker to that worker's backlog, so a burst does
not all go to the worker that looked idle at its last heartbeat. A job of the high or normal band
goes on the own stream of the worker that holds `affinity_min_blocks` or more of its prefix and
would finish its prefill first (conveyor/jobqueue/placement.best_worker), with one script that falls back to
the shared stream if the own stream is gone (its worker left and the fleet deleted it): both streams
are in the shard's slot, so the check and the XADD are atomic and no job lands on a stream nobody
reads. The same script rings the shard's doorbell (Keys.placed), on which idle workers block.
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from conveyor.jobqueue.bands import band_of
from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.placement import AFFINITY_BANDS, WorkerPrefixes, best_worker, decode_summary
from conveyor.jobqueue.queue import read_owners
from conveyor.jobqueue.scripts.jobs import ENQUEUE
from conveyor.settings import Settings
from conveyor.wire.heartbeat import WorkerInfo
from conveyor.wire.job import JobSpec

log = logging.getLogger(__name__)


class Placement:
    def __init__(self, redis: Redis, keys: Keys, settings: Settings) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings
        self._summaries: dict[str, WorkerPrefixes] = {}
        self._read_at = -1e9  # monotonic time of the last refresh
        self._refresh: asyncio.Task[None] | None = None

    def enqueue(self, pipe: Pipeline, spec: JobSpec, fields: dict[str, str]) -> str | None:
        """Queues the job on the own stream of the worker holding its prefix and answers that worker,
        or returns None (the caller queues it on the shared stream)."""
        band = band_of(spec.priority, self.settings.priority_bands)
        if not self.settings.affinity or band not in AFFINITY_BANDS:
            return None
        self._maybe_refresh()
        best = best_worker(spec.prompt_ids, self._summaries, self.settings.affinity_min_blocks)
        if best is None:
            return None
        worker, blocks = best
        held = self._summaries[worker]
        uncached = len(spec.prompt_ids) - blocks * held.summary.block_size
        self._summaries[worker] = WorkerPrefixes(held.summary, held.backlog_tokens + uncached)
        shard = self.keys.shard_of(spec.id)
        shared = self.keys.stream_of(spec.id, spec.priority, self.settings.priority_bands)
        args = [item for pair in fields.items() for item in pair]
        own = self.keys.own_stream(shard, worker)
        pipe.execute_command("EVAL", ENQUEUE.source, 3, own, shared, self.keys.placed(shard), *args)
        return worker

    def _maybe_refresh(self) -> None:
        if time.monotonic() - self._read_at < self.settings.heartbeat_interval_ms / 2000:
            return
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self.refresh(), name="affinity-refresh")

    async def refresh(self) -> None:
        """Reads every owner's summary (a missing one: that worker is gone or draining)."""
        self._read_at = time.monotonic()
        try:
            owners = sorted(set().union(*await read_owners(self.redis, self.keys)))
            pipe = self.redis.pipeline(transaction=False)
            for worker in owners:  # one key per command (cluster)
                pipe.get(self.keys.prefixes(worker))
                pipe.get(self.keys.worker(worker))
            replies = await pipe.execute() if owners else []
        except (RedisError, OSError) as exc:  # placement falls back to the shared streams meanwhile
            log.warning("could not read the workers' prefix summaries: %s", exc)
            return
        summaries = {}
        for worker, raw, beat in zip(owners, replies[::2], replies[1::2], strict=True):
            backlog = _backlog(beat) if beat else None
            if raw and backlog is not None and (summary := decode_summary(raw)) is not None:
                summaries[worker] = WorkerPrefixes(summary, backlog)
        self._summaries = summaries


def _backlog(heartbeat: str) -> int | None:
    """The prompt tokens the worker's engine has yet to prefill; None for a worker that drains (it
    reads no new jobs) or whose heartbeat this version cannot read. A worker whose engine has a job
    waiting for room still counts: it takes its own stream's jobs meanwhile (conveyor/worker/read_loop.py),
    and its backlog says how long they would wait there."""
    try:
        info = WorkerInfo.model_validate_json(heartbeat)
    except ValueError:
        return None
    return None if info.draining else info.load.prefill_backlog_tokens
