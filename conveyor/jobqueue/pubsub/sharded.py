"""The relay's live events on Redis Cluster: sharded pub/sub, one connection per node.

A job's channel is a shard channel (SPUBLISH, conveyor/jobqueue/pubsub/publish.py), delivered only by
the node that owns its hash slot, so the relay needs a connection to each node it has listeners on.
redis-py's ClusterPubSub keeps one such connection per node too, but reads them in turn, each with
the timeout given (an event on the third node waits out the first two); here each node's connection
is one `Subscriptions` (conveyor/jobqueue/pubsub/subscriptions.py) with its own reader, so the
reconnect, resync and liveness logic is the same as on one server. Channels are routed by redis-py's slot map
(`RedisCluster.get_node_from_key`) when their first listener comes.
"""

from __future__ import annotations

from collections.abc import Callable

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from conveyor.jobqueue.pubsub.subscriptions import Listener, Subscriptions
from conveyor.wire.job import JobEvent

OnEvent = Callable[[JobEvent], object] | None


def node_client(node: ClusterNode) -> Redis:
    """A plain client of one cluster node, with the cluster client's connection settings."""
    pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
    return Redis.from_pool(pool)


class ShardedSubscriptions:
    def __init__(self, cluster: RedisCluster, control_channel: str, on_event: OnEvent = None) -> None:
        self._cluster = cluster
        self._control = control_channel
        self._on_event = on_event
        self._nodes: dict[str, Subscriptions] = {}  # node name → its connection
        self._clients: list[Redis] = []
        self._routes: dict[str, Subscriptions] = {}  # channel → the node's connection it lives on

    @property
    def num_listeners(self) -> int:
        return sum(s.num_listeners for s in self._nodes.values())

    @property
    def down_since(self) -> float | None:
        """The earliest lost connection of any node (a node down leaves the cluster failing anyway)."""
        downs = [s.down_since for s in self._nodes.values() if s.down_since is not None]
        return min(downs) if downs else None

    @property
    def reconnects(self) -> int:
        return sum(s.reconnects for s in self._nodes.values())

    def confirmed(self, channel: str) -> bool:
        route = self._routes.get(channel)
        return route is not None and route.confirmed(channel)

    async def start(self) -> None:
        await self._cluster.initialize()
        for node in self._cluster.get_primaries():
            await self._node(node)

    async def stop(self) -> None:
        for subscriptions in self._nodes.values():
            await subscriptions.stop()
        for client in self._clients:
            await client.aclose()

    async def _node(self, node: ClusterNode) -> Subscriptions:
        subscriptions = self._nodes.get(node.name)
        if subscriptions is None:
            client = node_client(node)
            self._clients.append(client)
            subscriptions = Subscriptions(client, self._control, self._on_event, sharded=True)
            self._nodes[node.name] = subscriptions
            await subscriptions.start()
        return subscriptions

    async def add(self, channel: str, listener: Listener) -> None:
        route = self._routes.get(channel)
        if route is None:
            route = await self._node(self._cluster.get_node_from_key(channel))
            self._routes[channel] = route
        await route.add(channel, listener)

    def remove(self, channel: str, listener: Listener) -> None:
        route = self._routes.get(channel)
        if route is None:
            return
        route.remove(channel, listener)
        if not route.has_listeners(channel):
            del self._routes[channel]


def subscriptions_for(redis: Redis, control_channel: str,
                      on_event: OnEvent = None) -> Subscriptions | ShardedSubscriptions:
    """The relay's pub/sub: sharded on a cluster, one classic connection on a single node."""
    if isinstance(redis, RedisCluster):
        return ShardedSubscriptions(redis, control_channel, on_event)
    return Subscriptions(redis, control_channel, on_event)

