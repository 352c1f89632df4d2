"""Turns a step's events into Redis writes: one pipeline per step, never one round trip per token, and
one APPEND call per step and node (on a cluster: APPEND_NODE for a node's jobs of several slots),
never one per token or per job.

Two paths (conveyor/worker/coalesce.py). Durable: every event goes through the APPEND script, which
writes only while this worker owns the job (the record's `worker` field): a worker that lost a job to
another — it hung past its lease — learns so at its next write and stops, and can never interleave
its events with the new owner's. A job's entry in its jobs stream is acknowledged (and deleted) only
after its final record is written. Live: the tokens of followed jobs are published after the APPEND
calls of the same pipeline, one message per api process that follows any of them (Keys.live), so
whatever a step writes to an event stream is there before its live message reaches a relay (which
fills a gap from the stream). The live path is not fenced: a worker that lost a job publishes it
until its next durable write or lease renewal says so, and the relays drop what they have by index
(docs/operations/reliability.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, ResponseError

from conveyor.jobqueue.client import cluster_of
from conveyor.jobqueue.keys import DEAD_LETTER_MAXLEN, WORKER_GROUP, Keys, event_entry_id
from conveyor.jobqueue.pubsub.publish import publish_to_followers
from conveyor.jobqueue.queue import Entry, EntryRef, by_stream
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.wire.event_batch import dump_events
from conveyor.wire.job import JobEvent, JobResult
from conveyor.worker.owned import InFlight

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from conveyor.worker.observe import Observer


Batch = tuple[InFlight, list[JobEvent]]  # a job's events written as one entry


@dataclass(slots=True)
class Published:
    ended: list[InFlight] = field(default_factory=list)  # final record written, entry acknowledged
    lost: list[InFlight] = field(default_factory=list)  # owned by another worker now: stop running it


class Publisher:
    def __init__(self, redis: Redis, keys: Keys, worker_id: str, scripts: Scripts, result_ttl: int,
                 event_stream_maxlen: int, observer: Observer | None = None,
                 events_ttl: int | None = None) -> None:
        self.redis = redis
        self.observer = observer
        self.keys = keys
        self.worker_id = worker_id
        self.scripts = scripts
        self.result_ttl = result_ttl
        # An ended job's per-token events live this long (Settings.events_ttl; None: as long as its record).
        self.events_ttl = events_ttl or result_ttl
        self.maxlen = event_stream_maxlen
        self.cluster = cluster_of(redis)

    async def publish(self, items: list[tuple[InFlight, JobEvent]],
                      live: Sequence[tuple[InFlight, JobEvent]] = ()) -> Published:
        """Writes events — a job's consecutive ones as one batch — in one pipeline (one APPEND call per
        node script group), then the live ones (one message per api process that follows any of the
        jobs), then acknowledges the jobs that ended."""
        now = time.time()
        batches: dict[str, tuple[InFlight, list[JobEvent]]] = {}
        for job, event in items:
            if event.at is None:  # when the engine emitted it, if the publish loop held it back
                event.at = round(now, 3)
            if event.token is not None:
                job.tokens = max(job.tokens, event.index + 1)
                if job.first_token_at is None:
                    job.first_token_at = now
            if event.result is not None:
                event.result.timings = job.timings(now)
            batches.setdefault(job.job_id, (job, []))[1].append(event)
        groups = self._groups(list(batches.values()))
        live_batches: dict[str, tuple[InFlight, list[JobEvent]]] = {}
        for job, event in live:
            if event.result is not None and event.result.timings is None:
                event.result.timings = job.timings(now)
            live_batches.setdefault(job.job_id, (job, []))[1].append(event)
        messages: dict[str, dict[str, str]] = {}  # follower → {job id: events}: one message per api
        for job, events in live_batches.values():
            batch = dump_events(events)
            for follower in job.followers:
                messages.setdefault(follower, {})[job.job_id] = batch

        def build(pipe: Pipeline) -> None:
            for group in groups:
                self._append(pipe, group, now)
            publish_to_followers(pipe, self.keys, messages)

        # The publishes' replies (receiver counts) are not read: a live message nobody got is filled
        # from the event stream by the relay that missed it.
        results = (await self.scripts.execute(build))[: len(groups)]
        if stale := [i for i, reply in enumerate(results) if _off_node(reply)]:
            groups, results = await self._by_slot_again(groups, results, stale, now)
        out = Published()
        finals: list[tuple[InFlight, JobResult]] = []
        for group, reply in zip(groups, results, strict=True):
            if isinstance(reply, Exception):
                raise reply
            codes, followed = reply
            for (job, events), code, watched in zip(group, codes, followed, strict=True):
                job.followers.update(watched.split())  # marks are only ever added
                if code == 0:
                    out.lost.append(job)
                elif events[-1].final:
                    job.ended = True  # before the ack: the lease loop must not read it as lost
                    out.ended.append(job)
                    if events[-1].result is not None:
                        finals.append((job, events[-1].result))
        await self.ack([job.ref for job in out.ended])
        if self.observer is not None:
            for job, job_result in finals:
                self.observer.ended(job, job_result)
        return out

    def _groups(self, batches: list[Batch]) -> list[list[Batch]]:
        """The batches one APPEND call writes together: all of them on one node; on a cluster those
        its client's map puts on one node (a job's keys share its hash tag, so its slot)."""
        if not self.cluster:
            return [batches] if batches else []
        by_node: dict[str, list[Batch]] = {}
        for batch in batches:
            try:
                node = self.redis.get_node_from_key(self.keys.job(batch[0].job_id)).name  # type: ignore[attr-defined]
            except RedisClusterException:  # a slot no node serves now (mid-failover): its own call
                node = f"slot {self._slot(batch)}"
            by_node.setdefault(node, []).append(batch)
        return list(by_node.values())

    async def _by_slot_again(self, groups: list[list[Batch]], results: list[object], stale: list[int],
                             now: float) -> tuple[list[list[Batch]], list[object]]:
        """A node's call reached a key of a slot the node no longer serves (the slot moved: a
        failover, a resharding): its jobs are written again one slot a call, which redis-py routes
        (and follows to the slot's new node)."""
        log.info("%d APPEND call(s) reached a slot their node no longer serves: writing by slot", len(stale))
        again = [group for i in stale for group in self._by_slot(groups[i])]

        def build(pipe: Pipeline) -> None:
            for group in again:
                self._append(pipe, group, now)

        replies = await self.scripts.execute(build)
        stale_set = set(stale)
        kept = [i for i in range(len(groups)) if i not in stale_set]
        return [groups[i] for i in kept] + again, [results[i] for i in kept] + list(replies)

    def _by_slot(self, batches: list[Batch]) -> list[list[Batch]]:
        by_slot: dict[int, list[Batch]] = {}
        for batch in batches:
            by_slot.setdefault(self._slot(batch), []).append(batch)
        return list(by_slot.values())

    def _slot(self, batch: Batch) -> int:
        return key_slot(self.keys.job(batch[0].job_id).encode())

    def _append(self, pipe: Pipeline, group: list[Batch], now: float) -> None:
        keys: list[str] = []
        args: list[object] = [self.worker_id, self.maxlen, now, self.result_ttl, self.events_ttl]
        for job, events in group:
            last, result = events[-1], events[-1].result
            first = any(e.token is not None and e.index == 0 for e in events)  # the first-token milestone
            keys += [self.keys.job(job.job_id), self.keys.events(job.job_id)]
            args += [event_entry_id(last.index), dump_events(events), int(first), int(last.final),
                     result.status.value if result else "",
                     result.model_dump_json(exclude_none=True) if result else "", last.index]
        if self.cluster and len({self._slot(batch) for batch in group}) > 1:  # a node's, of several slots
            self.scripts.call(pipe, "append_node", keys[:1], [*args, *keys[1:], len(keys)])
        else:
            self.scripts.call(pipe, "append", keys, args)

    async def ack(self, refs: list[EntryRef]) -> None:
        """Acknowledge and delete entries of the jobs streams: they keep only unfinished jobs. One
        pipeline, one stream per command (one slot each on Redis Cluster)."""
        streams = by_stream(ref for ref in refs if ref[0])
        if not streams:
            return
        pipe = self.redis.pipeline(transaction=False)
        for stream, entry_ids in streams.items():
            pipe.xack(stream, WORKER_GROUP, *entry_ids)
            pipe.xdel(stream, *entry_ids)
        await pipe.execute()

    async def dead_letter(self, entry: Entry, reason: str) -> None:
        """Copy an entry to the dead-letter stream; the caller then ends the job and acknowledges."""
        fields: dict[Any, Any] = {  # redis-py's stubs: not dict[str, str]
            **entry.fields, "entry_id": entry.entry_id, "stream": entry.stream,
            "deliveries": entry.deliveries, "reason": reason, "worker": self.worker_id, "at": time.time()}
        await self.redis.xadd(self.keys.dead_letter_stream, fields, maxlen=DEAD_LETTER_MAXLEN,
                              approximate=True)
        if self.observer is not None:
            self.observer.dead_lettered()


def _off_node(reply: object) -> bool:
    """An APPEND_NODE call that reached a key its node does not serve (the server's words)."""
    return isinstance(reply, ResponseError) and "non local key" in str(reply)
