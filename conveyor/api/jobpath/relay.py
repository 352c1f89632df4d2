"""Relays a job's events to the SSE clients of this api process (docs/design.md §1 step 6).

One pub/sub connection per process (conveyor/jobqueue/pubsub/subscriptions.py), subscribed to the
process's own live channel (Keys.live: one message per worker step carries every job this process
follows), demultiplexed in-process (conveyor/api/jobpath/live_router.py). A client registers first,
then reads the durable event stream after its last index, then takes live events, deduplicating by
index: pub/sub alone is at-most-once; the event stream makes the relay lossless and resumable. The
worker writes the event stream less often than it publishes (every durable interval against every
stream interval: conveyor/worker/coalesce.py), so live events run ahead of it: a client that may
have missed some — its bounded buffer overflowed (a slow client never blocks the others), an index
was skipped, or the connection was lost and subscribed again (Redis restarted) — asks the job's
worker to write what it holds (the WATCH script's notice) and goes back to the event stream after
the last index it delivered, whose next live message then finds the stream holding everything before
it. Where the rest cannot be delivered without a gap, the stream raises StreamInterrupted, which the
routes answer with an error event: never silence. A job that ended more than `replay_window` ago has
no per-token events left: its replay is the one final event its record keeps (same index, the whole
result), the one skip of indices that is not a gap.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError

from conveyor.api.errors import ValidationError
from conveyor.api.jobpath.alarm import Alarm
from conveyor.api.jobpath.live_router import LiveRouter
from conveyor.api.jobpath.live_run import Run
from conveyor.jobqueue.keys import Keys, event_entry_id
from conveyor.jobqueue.pubsub.sharded import subscriptions_for
from conveyor.jobqueue.pubsub.subscriptions import Listener, Signal
from conveyor.jobqueue.redis_errors import is_transient
from conveyor.jobqueue.scripts.jobs import WATCH
from conveyor.wire.event_batch import events_after, load_events
from conveyor.wire.job import JobEvent, RecordField

KEEPALIVE_S = 15.0
OUTAGE_TIMEOUT_S = 30.0  # a stream waits this long for a lost Redis to come back, then ends with an error
RETRY_FIRST_S, RETRY_MAX_S = 0.05, 1.0  # backoff of a backlog read that Redis refused for a moment
MAX_INDEX = 2**62  # entry ids are 0-(index+1): an index past this names no event
DURABLE_WAIT_S = 1.25  # the default durable interval (250 ms) and a second for the step and round trips


class StreamInterrupted(RedisConnectionError):
    """A job's events could not be followed to the end (the job itself goes on): Redis stayed
    unreachable past the outage timeout, or events are missing from the job's event stream."""


@dataclass(slots=True)
class RelayStats:
    live: int = 0  # events delivered as they were published
    replayed: int = 0  # events delivered from the durable event stream
    resyncs: int = 0  # times a client went back to the event stream (overflow, gap, reconnect)


@dataclass(frozen=True, slots=True)
class Backlog:
    events: list[JobEvent]  # index > after, in order
    last_index: int  # the stream's last index; -1: no event yet
    ended: bool  # the job's final event is at or before `after` (the client has seen the end)
    # `events` is the record's final event alone: the job ended more than `replay_window` ago and its
    # per-token events expired, so the indices before it are skipped on purpose (its result has it all)
    compacted: bool = False


class Relay:
    def __init__(self, redis: Redis, keys: Keys, on_lag: Callable[[float], object] | None = None,
                 keepalive_s: float = KEEPALIVE_S, outage_timeout: float = OUTAGE_TIMEOUT_S,
                 durable_wait_s: float = DURABLE_WAIT_S, api_id: str | None = None) -> None:
        self.redis = redis
        self.keys = keys
        # This process's name in the records it follows (`watched`) and its channel's: new each start,
        # so a restarted api never receives what was meant for the process it replaced.
        self.api_id = api_id or uuid.uuid4().hex[:12]
        self.live_channel = keys.live(self.api_id)
        self.keepalive_s = keepalive_s  # settings.sse_keepalive_s; 0: no keep-alives
        self.outage_timeout = outage_timeout
        # How long a resume past the event stream's end waits for the worker to write what it
        # published live: the durable interval (every write is at most that late) and some margin.
        self.durable_wait_s = durable_wait_s
        self.on_lag = on_lag  # seconds from the worker's publish to here, per live event
        self.stats = RelayStats()
        # One classic connection on a single node; one per node, sharded, on a cluster.
        self.subscriptions = subscriptions_for(redis, f"{keys.prefix}:relay")
        self.router = LiveRouter(on_event=self._observe)
        self._watch = redis.register_script(WATCH.source)

    @property
    def num_clients(self) -> int:
        return len(self.router)

    def subscribed(self, job_id: str) -> bool:
        """Whether a client of this process follows the job, on the live channel the server confirmed."""
        return job_id in self.router and self.subscriptions.confirmed(self.live_channel)

    async def start(self) -> None:
        await self.subscriptions.start()
        await self.subscriptions.add(self.live_channel, self.router)

    async def stop(self) -> None:
        await self.subscriptions.stop()

    def _observe(self, event: JobEvent) -> None:
        if self.on_lag is not None and event.at is not None:
            self.on_lag(max(0.0, time.time() - event.at))

    async def backlog(self, job_id: str, after: int) -> Backlog:
        """The durable stream's events with index > after (entry ids follow the index, so XRANGE
        starts there), its last index, and whether the client has seen the final event."""
        key = self.keys.events(job_id)
        entries: list[tuple[str, dict[str, str]]] = []
        if after < MAX_INDEX:
            entries = await self.redis.xrange(key, min=event_entry_id(after + 1))  # type: ignore[assignment]
        events = events_after(entries, after)
        if events:
            return Backlog(events, events[-1].index, ended=False)
        tail: list[tuple[str, dict[str, str]]] = await self.redis.xrevrange(key, count=1)  # type: ignore[assignment]
        last = load_events(tail[0][1]["e"])[-1] if tail else None
        if last is not None and last.index > after:  # written between the two reads: read them now
            return await self.backlog(job_id, after)
        if last is None and (final := await self.final_event(job_id)) is not None:
            # The record and the final entry are written in one script: a job that ran from its first
            # token to its end since the reads above has its events now; only expired ones are gone.
            if await self.redis.exists(key):
                return await self.backlog(job_id, after)
            if final.index > after:
                return Backlog([final], final.index, ended=False, compacted=True)
            return Backlog([], final.index, ended=True)
        return Backlog([], -1 if last is None else last.index, ended=last is not None and last.final)

    async def final_event(self, job_id: str) -> JobEvent | None:
        """The final event an ended job's record keeps (JobEvent.from_record); None before the end."""
        fields = (RecordField.FINAL, RecordField.RESULT)
        values: list[str | None] = await self.redis.hmget(self.keys.job(job_id), fields)  # type: ignore[misc,assignment]
        return JobEvent.from_record({f: v for f, v in zip(fields, values, strict=True) if v is not None})

    async def check_resume(self, job_id: str, after: int) -> None:
        """422 for a Last-Event-ID past the last event of a job that has not ended (nothing with a
        higher index would ever come); past the end of an ended job, the stream just ends. A client
        may have seen live events the event stream does not hold yet: past its end, the job's worker
        is asked to write them, and the stream is waited on (XREAD BLOCK) for `durable_wait_s`."""
        if after < 0:
            return
        backlog = await self.backlog(job_id, after)
        if after > backlog.last_index and not backlog.ended:
            await self._watch(keys=[self.keys.job(job_id)],
                              args=[self.keys.control_channel, self.api_id, job_id, 1])
            deadline = time.monotonic() + self.durable_wait_s
            while after > backlog.last_index and not backlog.ended:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    break
                since = event_entry_id(backlog.last_index) if backlog.last_index >= 0 else "0-0"
                await self.redis.xread({self.keys.events(job_id): since}, count=1, block=left_ms)
                backlog = await self.backlog(job_id, after)
        _check_after(job_id, after, backlog)

    async def batches(self, job_id: str, after: int = -1) -> AsyncIterator[list[JobEvent] | None]:
        """Yields the job's events with index > after, each once and in order, ending with the final
        one (at once if the client saw the final event already): in batches, each what one wake-up
        found (a live message's events of the job, and those of every message queued behind it), so
        that a dialect renders and writes them at once instead of passing each token through.

        Yields None when nothing arrived for `keepalive_s` (time for an SSE keep-alive comment).
        Raises StreamInterrupted when the rest cannot be delivered without a gap.
        """
        channel = self.live_channel
        listener = Listener()
        alarm = Alarm(lambda: listener.put(Signal.WAKE))
        last = after
        try:
            if self.subscriptions.down_since_for(channel) is not None:
                raise RedisConnectionError("Redis does not answer: the relay is reconnecting")
            self.router.add(job_id, listener)
            backlog = await self._backlog(job_id, last, watch=1)
            _check_after(job_id, after, backlog)
            pending: list[JobEvent] = []  # live events past a gap: delivered once the stream fills it
            while True:
                if backlog.ended:
                    return
                batch: list[JobEvent] = []
                for event in backlog.events:
                    if event.index != last + 1 and not backlog.compacted:
                        raise StreamInterrupted(
                            f"events {last + 1}..{event.index - 1} of job {job_id} are missing from its "
                            "event stream (lost in a Redis restart?): read its result with GET "
                            f"/v1/jobs/{job_id}")
                    last = event.index
                    batch.append(event)
                    if event.final:
                        break
                self.stats.replayed += len(batch)
                # Past a second gap the rest is dropped: the next live message finds the gap again.
                run = Run(last)
                run.take(pending)
                self.stats.live += len(run.events)
                batch += run.events
                if batch:
                    last = batch[-1].index
                    yield batch
                if run.done or (batch and batch[-1].final):
                    return
                pending = []
                listener.overflowed = False
                keepalive_at = self._keepalive_at()
                idle = resync = False
                while not listener.overflowed and not resync:
                    item = await self._next(channel, listener, alarm, keepalive_at)
                    if item is None:
                        yield None
                        idle = True  # nothing live for a while: look at the stream (a missed end)
                        break
                    if isinstance(item, Signal):  # RESYNC (DOWN never leaves _next)
                        break
                    run = Run(last)
                    run.take(item)
                    while run.open and not listener.queue.empty():  # what else came meanwhile
                        queued = listener.queue.get_nowait()
                        if queued is Signal.RESYNC:
                            resync = True
                            break
                        if not isinstance(queued, Signal):
                            run.take(queued)
                    if run.events:
                        last = run.events[-1].index
                        self.stats.live += len(run.events)
                        yield run.events
                        keepalive_at = self._keepalive_at()
                    if run.done:
                        return
                    if run.gap:  # missed live events: read them from the stream
                        pending = run.gap
                        break
                if idle:
                    backlog = await self._backlog(job_id, last)
                    continue
                # A gap, an overflow or a reconnect: have the worker write what it holds and catch up
                # from the durable stream (a live message that comes later comes after that write).
                self.stats.resyncs += 1
                if not pending:  # overflowed or reconnected: what is queued may have holes
                    while not listener.queue.empty():
                        listener.queue.get_nowait()
                backlog = await self._backlog(job_id, last, watch=2)
        finally:
            alarm.cancel()
            self.router.remove(job_id, listener)

    def _keepalive_at(self) -> float:
        return time.monotonic() + self.keepalive_s if self.keepalive_s > 0 else math.inf

    async def _backlog(self, job_id: str, after: int, watch: int = 0) -> Backlog:
        """`backlog`, read again while Redis cannot serve for a moment (a node restarting, a cluster
        failing over: CLUSTERDOWN, LOADING, a lost connection), for at most the outage timeout.
        `watch` 1: first mark the job followed, so that its worker publishes its tokens live once the
        mark's notice (or its next write) reaches it (subscribed, then marked, then read: an event
        written before the mark is in the read, the ones after it come live); 2: announce it again
        (live events were missed: the worker writes what it holds). scripts/jobs.py WATCH."""
        deadline = time.monotonic() + self.outage_timeout
        delay = RETRY_FIRST_S
        while True:
            try:
                if watch:
                    await self._watch(keys=[self.keys.job(job_id)],
                                      args=[self.keys.control_channel, self.api_id, job_id, int(watch == 2)])
                    watch = 0
                return await self.backlog(job_id, after)
            except StreamInterrupted:
                raise
            except (RedisError, RedisClusterException, OSError) as exc:
                if not is_transient(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    raise StreamInterrupted(f"the event stream of job {job_id} cannot be read ({exc}): "
                                            f"resume with Last-Event-ID: {after}") from exc
            await asyncio.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_S)

    async def _next(self, channel: str, listener: Listener, alarm: Alarm,
                    keepalive_at: float) -> list[JobEvent] | Signal | None:
        """The listener's next live message (its events of the job) or RESYNC; None when a keep-alive
        is due. While the connection that carries the channel is lost, waits for it (or for the
        channel to move to a node that took over, on a cluster) at most `outage_timeout`, then raises
        StreamInterrupted."""
        queue = listener.queue
        while True:
            if not queue.empty():
                item = queue.get_nowait()
            else:
                now = time.monotonic()
                wake_at = keepalive_at
                down_since = self.subscriptions.down_since_for(channel)
                if down_since is not None:
                    if down_since + self.outage_timeout <= now:
                        raise StreamInterrupted(
                            f"Redis has not answered for {self.outage_timeout:.0f} s: the stream ends "
                            "here, the job goes on (resume with Last-Event-ID)")
                    wake_at = min(wake_at, down_since + self.outage_timeout)
                if keepalive_at <= now:
                    return None
                if not math.isinf(wake_at):
                    alarm.set(wake_at)
                # A plain get: cancelled with the task, never lost to a timeout (wait_for on Python
                # 3.11 dropped a cancellation that landed as the get completed).
                item = await queue.get()
            if item is not Signal.DOWN and item is not Signal.WAKE:  # both only wake the clocks
                return item


def _check_after(job_id: str, after: int, backlog: Backlog) -> None:
    if after > backlog.last_index and not backlog.ended:
        raise ValidationError(
            f"Last-Event-ID {after} is past the last event of job {job_id}, which has not ended (its last "
            f"index is {backlog.last_index}; -1: none yet): send the id of the last event you received, "
            "or no Last-Event-ID to read from the start", param="Last-Event-ID")
