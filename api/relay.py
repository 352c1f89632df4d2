"""Relays a job's events to the SSE clients of this api process (DESIGN.md §1 step 6).

One pub/sub connection per process, demultiplexed in-process. A client subscribes first, then
reads the durable event stream after its last index, then takes live events, deduplicating by
index: pub/sub alone is at-most-once; the event stream makes the relay lossless and resumable.
A client whose bounded buffer overflows is moved back to reading the durable stream, so a slow
client never blocks the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from dataclasses import dataclass, field

from redis.asyncio import Redis

from schemas.job import JobEvent
from schemas.keys import Keys

log = logging.getLogger(__name__)

CLIENT_BUFFER = 1024
KEEPALIVE_S = 15.0


@dataclass(eq=False)
class _Listener:
    queue: asyncio.Queue[JobEvent] = field(default_factory=lambda: asyncio.Queue(CLIENT_BUFFER))
    overflowed: bool = False


class Relay:
    def __init__(self, redis: Redis, keys: Keys, on_lag: Callable[[float], object] | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.on_lag = on_lag  # seconds from the worker's publish to here, per live event
        self._pubsub = redis.pubsub()
        self._listeners: dict[str, set[_Listener]] = {}
        self._subscribed: dict[str, asyncio.Event] = {}  # channel → set once the server confirmed
        self._lock = asyncio.Lock()  # orders (un)subscribe commands on the one connection
        self._background: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None

    @property
    def num_clients(self) -> int:
        return sum(len(v) for v in self._listeners.values())

    async def start(self) -> None:
        # A pub/sub connection needs one subscription before it can be read.
        await self._pubsub.subscribe(f"{self.keys.prefix}:relay")
        self._task = asyncio.create_task(self._read(), name="relay")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._background):
            task.cancel()
        await self._pubsub.aclose()

    async def _read(self) -> None:
        while True:
            message = await self._pubsub.get_message(timeout=1.0)
            if message is None:
                continue
            channel = message["channel"]
            if message["type"] == "subscribe" and channel in self._subscribed:
                self._subscribed[channel].set()
            if message["type"] != "message":
                continue
            try:
                event = JobEvent.model_validate_json(message["data"])
            except ValueError:
                log.warning("dropping a malformed event on %s", channel)
                continue
            if self.on_lag is not None and event.at is not None:
                self.on_lag(max(0.0, time.time() - event.at))
            for listener in self._listeners.get(channel, ()):
                try:
                    listener.queue.put_nowait(event)
                except asyncio.QueueFull:
                    listener.overflowed = True

    async def _sync(self, channel: str) -> None:
        """Subscribes or unsubscribes the channel as its listeners now need; serialized, and decided
        when it runs, so an unsubscribe left running in the background never undoes a newer subscribe."""
        async with self._lock:
            wanted = bool(self._listeners.get(channel))
            if wanted and channel not in self._subscribed:
                self._subscribed[channel] = asyncio.Event()
                await self._pubsub.subscribe(channel)
            elif not wanted and channel in self._subscribed:
                del self._subscribed[channel]
                await self._pubsub.unsubscribe(channel)

    async def _subscribe(self, channel: str, listener: _Listener) -> None:
        self._listeners.setdefault(channel, set()).add(listener)
        await self._sync(channel)
        confirmed = self._subscribed.get(channel)
        if confirmed is not None:
            await asyncio.wait_for(confirmed.wait(), timeout=10)

    def _unsubscribe(self, channel: str, listener: _Listener) -> None:
        """Never awaits: it runs when a client's task is being cancelled."""
        listeners = self._listeners.get(channel)
        if listeners is None:
            return
        listeners.discard(listener)
        if not listeners:
            del self._listeners[channel]
            task = asyncio.get_running_loop().create_task(self._sync(channel))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def backlog(self, job_id: str, after: int) -> tuple[list[JobEvent], bool]:
        """Events of the durable stream with index > after, and whether the job's final event is at
        or before `after` (a client that has seen the end)."""
        entries = await self.redis.xrange(self.keys.events(job_id))
        events = [JobEvent.model_validate_json(fields["e"]) for _id, fields in entries]
        ended = any(e.final and e.index <= after for e in events)
        return [e for e in events if e.index > after], ended

    async def events(self, job_id: str, after: int = -1) -> AsyncIterator[JobEvent | None]:
        """Yields the job's events with index > after, ending with the final one (at once if the
        client saw the final event already).

        Yields None when nothing arrived for KEEPALIVE_S (time for an SSE keep-alive comment).
        """
        channel = self.keys.channel(job_id)
        listener = _Listener()
        last = after
        try:
            await self._subscribe(channel, listener)
            while True:
                backlog, ended = await self.backlog(job_id, last)
                if ended:
                    return
                for event in backlog:
                    if event.index <= last:  # a duplicate final event
                        continue
                    last = event.index
                    yield event
                    if event.final:
                        return
                listener.overflowed = False
                while not listener.overflowed:
                    try:
                        event = await asyncio.wait_for(listener.queue.get(), timeout=KEEPALIVE_S)
                    except TimeoutError:
                        yield None
                        continue
                    if event.index <= last:  # already sent from the backlog
                        continue
                    if event.index > last + 1:  # a gap: missed live events, read them from the stream
                        break
                    last = event.index
                    yield event
                    if event.final:
                        return
                # Overflowed or a gap: drop the buffer and catch up from the durable stream.
                while not listener.queue.empty():
                    listener.queue.get_nowait()
        finally:
            self._unsubscribe(channel, listener)
