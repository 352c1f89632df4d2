"""The one pub/sub connection of an api process (docs/design.md §1 step 6): a channel is subscribed
while it has listeners, each message is handed to its channel's listeners (a `Sink`: the relay's
router of its process channel, conveyor/api/jobpath/live_router.py, which fills each client's
bounded `Listener`), and a lost connection is noticed and recovered.

redis-py reconnects a pub/sub connection on its next read and subscribes it again to every channel
it holds. Whatever was published in between was missed, so when the server confirms a channel that
it had confirmed before, each listener of that channel gets RESYNC: re-read the job's event stream
after the last index it delivered. An idle connection is pinged, so a server that stopped answering
(paused, or a half-open socket) counts as lost too. While the connection is lost, `down_since` says
since when (the relay ends streams that wait longer than its outage timeout).

`sharded`: the job channels are shard channels (SSUBSCRIBE, on Redis Cluster), this connection one
node's; conveyor/jobqueue/pubsub/sharded.py keeps one such Subscriptions per node. The control channel
stays classic. A node that stops serving a channel says so (a `sunsubscribe` it sends when a failover
takes its slots, or MOVED in answer to SSUBSCRIBE): `on_moved` is told, and the channel's listeners
are then moved (`detach` here, `adopt` on the node that serves it now, which sends them RESYNC once
it confirms the channel).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import MethodType
from typing import Any, Protocol

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterPubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from conveyor.jobqueue.pubsub.shutdown import finish_within
from conveyor.wire.job import JobEvent

log = logging.getLogger("conveyor.api.jobpath.relay")

CLIENT_BUFFER = 1024  # live messages a listener may fall behind before it re-reads the event stream
READ_TIMEOUT_S = 1.0
PING_S = 5.0  # an idle connection is pinged this often...
PONG_TIMEOUT_S = 5.0  # ...and counts as lost when the answer takes longer
SOCKET_TIMEOUT_S = 5.0  # connect and handshake: a paused server must not hold the reconnect
CONFIRM_TIMEOUT_S = 10.0
MAX_BACKOFF_S = 1.0


class Signal(enum.Enum):
    RESYNC = "resync"  # messages may have been missed: re-read the event stream
    DOWN = "down"  # the connection was lost: mind the outage deadline
    WAKE = "wake"  # the reader's own timer (the relay's keep-alive and outage clocks: api/jobpath/alarm.py)


class Sink(Protocol):
    """What a channel's messages and signals are handed to."""

    def put(self, item: Signal) -> None: ...

    def message(self, data: str) -> None: ...


@dataclass(eq=False)
class Listener:
    """One client's bounded queue of one job's events: each item a live message's events of the job
    (in order), or a signal."""

    queue: asyncio.Queue[list[JobEvent] | Signal] = field(
        default_factory=lambda: asyncio.Queue(CLIENT_BUFFER))
    overflowed: bool = False  # events were dropped: re-read the event stream

    def put(self, item: list[JobEvent] | Signal) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            if item is not Signal.DOWN and item is not Signal.WAKE:  # a full queue wakes its reader anyway
                self.overflowed = True


def dedicated(redis: Redis) -> Redis:
    """A client of the same server for the pub/sub connection alone: redis-py's retries off (a lost
    connection must surface to the reader at once, not after seconds of hidden retries) and socket
    timeouts on (a paused server must not hold a reconnect forever)."""
    base = redis.connection_pool
    kwargs: dict[str, Any] = {**base.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
    for name in ("socket_timeout", "socket_connect_timeout"):
        if kwargs.get(name) is None:
            kwargs[name] = SOCKET_TIMEOUT_S
    pool = ConnectionPool(connection_class=base.connection_class, max_connections=4, **kwargs)
    return Redis.from_pool(pool)


class Subscriptions:
    def __init__(self, redis: Redis, control_channel: str, sharded: bool = False,
                 on_moved: Callable[[list[str]], object] | None = None) -> None:
        self._redis = dedicated(redis)
        self._pubsub = self._redis.pubsub()
        self._sharded = sharded
        if sharded:  # a reconnect resubscribes one SSUBSCRIBE per slot, as redis-py's ClusterPubSub does
            # (one SSUBSCRIBE of channels in several slots is refused with CROSSSLOT)
            self._pubsub._resubscribe_shard_channels = MethodType(  # type: ignore[method-assign]
                ClusterPubSub._resubscribe_shard_channels, self._pubsub)
        self._control = control_channel  # always subscribed: a pub/sub connection needs one to be read
        self._on_moved = on_moved  # channels this node says it does not serve (sharded)
        self._listeners: dict[str, set[Sink]] = {}
        self._confirmed: dict[str, asyncio.Event] = {}  # channel → set once the server confirmed it
        self._adopted: set[str] = set()  # moved here: RESYNC its listeners once confirmed
        self._lock = asyncio.Lock()  # orders the commands sent on the one connection
        self._background: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._heard_at = time.monotonic()
        self._ping_sent_at: float | None = None
        self.down_since: float | None = None  # time.monotonic() when the connection was lost
        self.reconnects = 0

    @property
    def num_listeners(self) -> int:
        return sum(len(v) for v in self._listeners.values())

    def has_listeners(self, channel: str) -> bool:
        return bool(self._listeners.get(channel))

    def down_since_for(self, channel: str) -> float | None:
        """Since when the connection that carries `channel` is lost (None: it is not)."""
        return self.down_since

    def confirmed(self, channel: str) -> bool:
        event = self._confirmed.get(channel)
        return event is not None and event.is_set()

    async def start(self) -> None:
        await self._pubsub.subscribe(self._control)
        self._task = asyncio.create_task(self._read(), name="relay")

    async def stop(self) -> None:
        """Bounded (conveyor/jobqueue/pubsub/shutdown.py): the reader and the background (un)subscribes
        are cancelled and awaited, then the connection is closed."""
        tasks = [task for task in (self._task, *self._background) if task is not None]
        for task in tasks:
            task.cancel()
        await finish_within("the pub/sub reader", tasks)
        await finish_within("closing the pub/sub connection", [self._close()])

    async def _close(self) -> None:
        try:
            await self._pubsub.aclose()
        finally:
            await self._redis.aclose()

    async def add(self, channel: str, listener: Sink) -> None:
        """Adds the listener; returns once the server has confirmed the channel's subscription, so
        nothing published from then on is missed. The caller removes it (also when this raises)."""
        if self.down_since is not None:
            raise RedisConnectionError("Redis does not answer: the relay is reconnecting")
        self._listeners.setdefault(channel, set()).add(listener)
        await self._sync(channel)
        confirmed = self._confirmed.get(channel)
        if confirmed is not None:
            try:
                async with asyncio.timeout(CONFIRM_TIMEOUT_S):  # (wait_for may drop a cancel on 3.11)
                    await confirmed.wait()
            except TimeoutError:
                raise RedisConnectionError(f"Redis did not confirm a subscription within "
                                           f"{CONFIRM_TIMEOUT_S:.0f} s") from None

    def remove(self, channel: str, listener: Sink) -> None:
        """Never awaits: it runs when a client's task is being cancelled."""
        listeners = self._listeners.get(channel)
        if listeners is None:
            return
        listeners.discard(listener)
        if not listeners:
            del self._listeners[channel]
            self._later(self._sync(channel))

    def detach(self, channel: str) -> set[Sink]:
        """Takes the channel's listeners away (this node no longer serves it), without a command to a
        node that may be gone; an `add` waiting for this node's confirmation returns (the node that
        adopts the listeners sends them RESYNC)."""
        listeners = self._listeners.pop(channel, set())
        confirmed = self._confirmed.pop(channel, None)
        if confirmed is not None:
            confirmed.set()
        self._adopted.discard(channel)
        self._held().pop(channel, None)  # not subscribed again by a reconnect
        return listeners

    def adopt(self, channel: str, listeners: set[Sink]) -> None:
        """Listeners moved from another node: subscribed here, then told RESYNC (whatever was
        published while they moved is in the job's event stream). Never awaits."""
        self._listeners.setdefault(channel, set()).update(listeners)
        self._adopted.add(channel)
        self._later(self._sync(channel))

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # A reconnect subscribes every wanted channel again (_heard).
            log.warning("relay: a background (un)subscribe failed (%s: %s)", type(exc).__name__, exc)

    async def _sync(self, channel: str) -> None:
        """Subscribes or unsubscribes the channel as its listeners now need; serialized, and decided
        when it runs, so an unsubscribe left running in the background never undoes a newer subscribe."""
        async with self._lock:
            wanted = bool(self._listeners.get(channel))
            if wanted and channel not in self._confirmed:
                self._confirmed[channel] = asyncio.Event()
                try:
                    await (self._pubsub.ssubscribe if self._sharded else self._pubsub.subscribe)(channel)
                except BaseException:
                    del self._confirmed[channel]
                    raise
            elif not wanted and (channel in self._confirmed or channel in self._held()):
                self._confirmed.pop(channel, None)
                try:
                    await (self._pubsub.sunsubscribe if self._sharded else self._pubsub.unsubscribe)(channel)
                except (RedisError, OSError) as exc:  # a reconnect subscribes it again: dropped then
                    log.debug("unsubscribe %s failed (%s)", channel, exc)

    def _held(self) -> dict[Any, Any]:
        return self._pubsub.shard_channels if self._sharded else self._pubsub.channels

    async def _read(self) -> None:
        backoff = 0.05
        while True:
            try:
                message = await self._pubsub.get_message(timeout=READ_TIMEOUT_S)
                if message is None:
                    await self._check_alive()
                    continue
            except ResponseError as exc:  # an answer, not a lost connection
                self._refused(exc)
                continue
            except (RedisError, OSError) as exc:
                self._lost(exc)
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, MAX_BACKOFF_S)
                continue
            backoff = 0.05
            self._heard(message)

    async def _check_alive(self) -> None:
        now = time.monotonic()
        if self._ping_sent_at is not None and now - self._ping_sent_at > PONG_TIMEOUT_S:
            self._ping_sent_at = None
            connection = self._pubsub.connection
            if connection is not None:
                await connection.disconnect(nowait=True)  # the next read reconnects
            raise RedisConnectionError(f"Redis did not answer a PING within {PONG_TIMEOUT_S:.0f} s")
        if self._ping_sent_at is None and now - self._heard_at > PING_S:
            async with self._lock:
                await self._pubsub.ping()
            self._ping_sent_at = now

    def _lost(self, exc: BaseException) -> None:
        self._ping_sent_at = None
        if self.down_since is not None:
            return
        self.down_since = time.monotonic()
        log.warning("relay: lost its Redis connection (%s: %s); reconnecting", type(exc).__name__, exc)
        for listeners in self._listeners.values():
            for listener in listeners:
                listener.put(Signal.DOWN)

    def _refused(self, exc: ResponseError) -> None:
        """The node refused a command: on a cluster, an SSUBSCRIBE of a slot it does not serve (MOVED)
        or while the cluster is down; the channels it has not confirmed are to be placed again."""
        unconfirmed = [c for c, event in self._confirmed.items() if not event.is_set()]
        log.warning("relay: Redis refused a subscription (%s) of %s", exc, unconfirmed or "no channel")
        if self._on_moved is not None and unconfirmed:
            self._on_moved(unconfirmed)

    def _heard(self, message: dict[str, Any]) -> None:
        self._heard_at = time.monotonic()
        self._ping_sent_at = None
        if self.down_since is not None:
            log.warning("relay: reconnected to Redis after %.1f s", self._heard_at - self.down_since)
            self.down_since = None
            self.reconnects += 1
            for wanted in [c for c in self._listeners if c not in self._confirmed]:
                self._later(self._sync(wanted))  # its subscribe failed while the node was away
        kind, channel = message["type"], message["channel"]
        if kind in ("subscribe", "ssubscribe") and channel != self._control:
            self._on_subscribe(channel)
        elif kind in ("message", "smessage"):
            self._deliver(channel, message["data"])
        elif kind == "sunsubscribe" and channel in self._confirmed and self._on_moved is not None:
            self._on_moved([channel])  # not asked for (_sync forgets a channel first): its slot moved

    def _on_subscribe(self, channel: str) -> None:
        confirmed = self._confirmed.get(channel)
        if confirmed is None:  # nobody listens any more (subscribed again by a reconnect): drop it
            self._later(self._sync(channel))
        elif not confirmed.is_set():
            confirmed.set()
            if channel in self._adopted:
                self._adopted.discard(channel)
                for listener in self._listeners.get(channel, ()):
                    listener.put(Signal.RESYNC)
        else:  # confirmed before: a reconnect, and what was published meanwhile was missed
            for listener in self._listeners.get(channel, ()):
                listener.put(Signal.RESYNC)

    def _deliver(self, channel: str, data: str) -> None:
        for listener in self._listeners.get(channel, ()):
            listener.message(data)
