"""The relay's live events on Redis Cluster: sharded pub/sub, one connection per primary, and what
moves when the cluster's topology does.

A job's channel is a shard channel (SPUBLISH, conveyor/jobqueue/pubsub/publish.py), delivered only by
the node that serves its hash slot, so the relay needs a connection to each such node. redis-py's
ClusterPubSub keeps one such connection per node too, but reads them in turn, each with the timeout
given (an event on the third node waits out the first two); here each node's connection is one
`Subscriptions` (conveyor/jobqueue/pubsub/subscriptions.py) with its own reader, so the reconnect,
resync and liveness logic is the same as on one server. Channels are routed by redis-py's slot map
(`RedisCluster.get_node_from_key`) when their first listener comes.

A failover moves slots to another node: the old primary says so (a `sunsubscribe` of each channel
whose slot it lost, or MOVED in answer to SSUBSCRIBE), or dies and stays unreachable. Either way the
topology is read again (redis-py's nodes manager, which the api's other commands share), each
channel whose slot moved goes with its listeners to the node that serves it now (they RESYNC from
the job's event stream there), and the connections of nodes that are no longer primaries are
closed, so `down_since` (readiness) counts only the nodes that serve slots now.

The topology is read from one node, which may not have heard of the failover yet: a read that still
names as owner the node that said the channel moved is taken as stale, and the channel waits for the
next read, up to STALE_READ_S (a node that refused a subscription while the cluster was down may
really own the channel still: it is then subscribed there again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterDownError, RedisError

from conveyor.jobqueue.pubsub.shutdown import finish_within
from conveyor.jobqueue.pubsub.subscriptions import Sink, Subscriptions

log = logging.getLogger("conveyor.api.jobpath.relay")

LOST_BOUND_S = 1.0  # a node unreachable this long: ask the cluster whether a replica took its slots
REFRESH_EVERY_S = 0.5  # the topology is read at most this often
STALE_READ_S = 2.0  # a read naming a node that said it lost the channel is stale for this long


def node_client(node: ClusterNode) -> Redis:
    """A plain client of one cluster node, with the cluster client's connection settings."""
    pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
    return Redis.from_pool(pool)


class ShardedSubscriptions:
    def __init__(self, cluster: RedisCluster, control_channel: str) -> None:
        self._cluster = cluster
        self._control = control_channel
        self._nodes: dict[str, Subscriptions] = {}  # primary's name → its connection
        self._clients: dict[str, Redis] = {}
        self._routes: dict[str, str] = {}  # channel → the name of the node it is subscribed on
        self._moved: dict[str, float] = {}  # channel → when its node said it does not serve it
        self._refresh_wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.refreshes = 0  # topology reads that the relay asked for

    @property
    def num_listeners(self) -> int:
        return sum(s.num_listeners for s in self._nodes.values())

    @property
    def down_since(self) -> float | None:
        """The earliest lost connection of a node that serves slots now (a node whose replica took
        over is dropped at the next topology read)."""
        downs = [s.down_since for s in self._nodes.values() if s.down_since is not None]
        return min(downs) if downs else None

    def down_since_for(self, channel: str) -> float | None:
        name = self._routes.get(channel)
        return None if name is None else self._nodes[name].down_since

    @property
    def reconnects(self) -> int:
        return sum(s.reconnects for s in self._nodes.values())

    def confirmed(self, channel: str) -> bool:
        name = self._routes.get(channel)
        return name is not None and self._nodes[name].confirmed(channel)

    async def start(self) -> None:
        await self._cluster.initialize()
        for node in self._cluster.get_primaries():
            await self._node(node)
        self._task = asyncio.create_task(self._watch(), name="relay-topology")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await finish_within("the topology watch", [self._task])
        await asyncio.gather(*(self._drop(name) for name in list(self._nodes)))

    async def _node(self, node: ClusterNode) -> Subscriptions:
        subscriptions = self._nodes.get(node.name)
        if subscriptions is None:
            client = node_client(node)
            subscriptions = Subscriptions(client, self._control, sharded=True, on_moved=self._on_moved)
            try:
                await subscriptions.start()
            except BaseException:
                await subscriptions.stop()
                await client.aclose()
                raise
            self._nodes[node.name], self._clients[node.name] = subscriptions, client
        return subscriptions

    async def _drop(self, name: str) -> None:
        client = self._clients.pop(name)
        await self._nodes.pop(name).stop()
        await finish_within(f"closing the client of {name}", [client.aclose()])

    async def add(self, channel: str, listener: Sink) -> None:
        name = self._routes.get(channel)
        if name is None:
            node = self._cluster.get_node_from_key(channel)
            if node is None:  # (the relay's caller answers 503 to a RedisError)
                raise ClusterDownError(f"no node serves the slot of {channel}: the cluster is down")
            await self._node(node)
            name = self._routes.setdefault(channel, node.name)
        await self._nodes[name].add(channel, listener)

    def remove(self, channel: str, listener: Sink) -> None:
        name = self._routes.get(channel)
        if name is None:
            return
        self._nodes[name].remove(channel, listener)
        if not self._nodes[name].has_listeners(channel):
            del self._routes[channel]

    def _on_moved(self, channels: list[str]) -> None:
        now = time.monotonic()
        for channel in channels:
            self._moved.setdefault(channel, now)
        self._refresh_wanted.set()

    async def _watch(self) -> None:
        """Reads the topology when a node said a channel moved, or a node stays unreachable."""
        while True:
            with suppress(TimeoutError):
                async with asyncio.timeout(REFRESH_EVERY_S):
                    await self._refresh_wanted.wait()
            now = time.monotonic()
            lost = [name for name, s in self._nodes.items()
                    if s.down_since is not None and now - s.down_since > LOST_BOUND_S]
            if not (self._refresh_wanted.is_set() or self._moved or lost):
                continue
            self._refresh_wanted.clear()
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 (the loop must outlive any one failed read)
                log.warning("relay: could not read the cluster's topology (%s: %s); trying again",
                            type(exc).__name__, exc)
            await asyncio.sleep(REFRESH_EVERY_S)

    async def refresh(self) -> None:
        """Reads the topology, connects to new primaries, moves each channel whose slot moved (or
        that its node refused) to the node that serves it now, and drops non-primaries."""
        await self._cluster.nodes_manager.initialize()
        self.refreshes += 1
        primaries = {node.name: node for node in self._cluster.get_primaries()}
        for node in primaries.values():
            try:
                await self._node(node)
            except (RedisError, OSError) as exc:  # just promoted, or away: the next read tries again
                log.warning("relay: cannot subscribe on primary %s yet (%s)", node.name, exc)
        moved, self._moved = self._moved, {}
        now = time.monotonic()
        for channel, name in list(self._routes.items()):
            serving = self._cluster.get_node_from_key(channel)
            owner = None if serving is None else serving.name  # None: no node serves the slot now
            if owner == name and channel not in moved:
                continue
            said_at = moved.get(channel, now)
            stale = owner == name and now - said_at < STALE_READ_S  # the read predates the move
            if stale or owner is None or owner not in self._nodes:  # (or no node yet): next read
                self._moved[channel] = said_at
                continue
            log.info("relay: %s moves from %s to %s", channel, name, owner)
            listeners = self._nodes[name].detach(channel)
            if listeners:
                self._routes[channel] = owner
                self._nodes[owner].adopt(channel, listeners)
            else:
                del self._routes[channel]
        for name in set(self._nodes) - set(primaries) - set(self._routes.values()):
            log.warning("relay: %s serves no slot any more; its connection is closed", name)
            await self._drop(name)


def subscriptions_for(redis: Redis, control_channel: str) -> Subscriptions | ShardedSubscriptions:
    """The relay's pub/sub: sharded on a cluster, one classic connection on a single node."""
    if isinstance(redis, RedisCluster):
        return ShardedSubscriptions(redis, control_channel)
    return Subscriptions(redis, control_channel)
