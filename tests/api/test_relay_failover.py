"""The relay through a cluster failover: 3 primaries + 3 replicas on loopback (LocalCluster), streams
open on jobs in every primary's slots, one primary failed over by hand or SIGKILLed (its replica
promoted). Every stream goes on to its final event with no gap and no duplicate, and the relay ends
up connected to the primaries alone. Events are written as a worker writes them (XADD to the job's
event stream, then SPUBLISH to the relay's process channel, Keys.live); the faulted primary is the
one that serves that channel. The first test needs no cluster: listeners moved between two
connections."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from conveyor.api.jobpath.live_router import LiveRouter
from conveyor.api.jobpath.relay import Relay
from conveyor.api.redis_pool import api_redis
from conveyor.jobqueue.keys import Keys, event_entry_id
from conveyor.jobqueue.pubsub import sharded
from conveyor.jobqueue.pubsub.sharded import ShardedSubscriptions
from conveyor.jobqueue.pubsub.subscriptions import Listener, Signal, Subscriptions
from conveyor.launcher.redis_cluster import LocalCluster
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.settings import Settings
from conveyor.wire.event_batch import dump_live
from tests.api.test_relay import collect, wait_until
from tests.api.test_relay_faults import event

KEYS = Keys("relayfailover")
JOBS = [f"j{i}" for i in range(12)]
API = "relay-test"  # the relay's process id: its channel is KEYS.live(API)


async def write(redis: Redis, job_id: str, indices: range, final_at: int = -1, follower: str = API) -> None:
    """Each event as the worker writes it, retried while the cluster fails over (as the worker's
    outage handling does); an event is never written twice (its entry id is its index)."""
    for i in indices:
        data = event(i, final=i == final_at)
        deadline = time.monotonic() + 60
        while True:
            try:
                if not await redis.xrange(KEYS.events(job_id), min=event_entry_id(i), max=event_entry_id(i)):
                    await redis.xadd(KEYS.events(job_id), {"e": data}, id=event_entry_id(i))
                await redis.spublish(KEYS.live(follower), dump_live({job_id: f"[{data}]"}))
                break
            except RedisError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def test_listeners_moved_to_another_connection_resync_once_it_confirms(tmp_path: Path) -> None:
    """What a move does, on one server: `detach` hands the listeners over without a command,
    `adopt` subscribes them on the other connection and sends RESYNC once it is confirmed."""
    with EmbeddedRedis(tmp_path / "redis") as server:
        redis = Redis.from_url(server.url, decode_responses=True)
        old, new = Subscriptions(redis, "ctl"), Subscriptions(redis, "ctl")
        await old.start()
        await new.start()
        listener, router = Listener(), LiveRouter()  # a client of job j, on its process's channel
        router.add("j", listener)
        try:
            await old.add("ch", router)
            moved = old.detach("ch")
            assert moved == {router} and not old.has_listeners("ch")
            new.adopt("ch", moved)
            assert await asyncio.wait_for(listener.queue.get(), 10) is Signal.RESYNC
            assert new.confirmed("ch")
            await redis.publish("ch", dump_live({"j": f"[{event(0)}]"}))
            assert [e.index for e in await asyncio.wait_for(listener.queue.get(), 10)] == [0]  # type: ignore[union-attr]
        finally:
            await old.stop()
            await new.stop()
            await redis.aclose()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path, nodes=3, replicas=1, appendfsync="always") as running:
        yield running


@pytest.fixture
async def relay(cluster: LocalCluster) -> AsyncIterator[Relay]:
    relay = Relay(api_redis(Settings(redis_url=cluster.url)), KEYS, api_id=API)
    await relay.start()
    yield relay
    await relay.stop()
    await relay.redis.aclose()


async def streams_under_way(relay: Relay) -> tuple[dict[str, list[int]], list[asyncio.Task]]:
    seen: dict[str, list[int]] = {job: [] for job in JOBS}
    readers = [asyncio.create_task(collect(relay, job, into=seen[job])) for job in JOBS]
    await wait_until(lambda: all(relay.subscribed(job) for job in JOBS))
    await asyncio.gather(*(write(relay.redis, job, range(5)) for job in JOBS))
    await wait_until(lambda: all(s == list(range(5)) for s in seen.values()))
    return seen, readers


async def streams_end(relay: Relay, readers: list[asyncio.Task]) -> None:
    await asyncio.gather(*(write(relay.redis, job, range(5, 10), final_at=9) for job in JOBS))
    for job, reader in zip(JOBS, readers, strict=True):
        events = await asyncio.wait_for(reader, 60)
        assert [e.index for e in events] == list(range(10)) and events[-1].final, job


def primaries_of(relay: Relay) -> set[str]:
    subscriptions = relay.subscriptions
    assert isinstance(subscriptions, ShardedSubscriptions)
    return set(subscriptions._nodes)


async def test_streams_follow_a_manual_failover(cluster: LocalCluster, relay: Relay) -> None:
    _seen, readers = await streams_under_way(relay)
    owner = cluster.owner_of(relay.live_channel)
    promoted = cluster.replica_of(owner)
    await asyncio.to_thread(cluster.failover, promoted)  # the old primary sunsubscribes its channels
    await streams_end(relay, readers)
    await wait_until(lambda: f"127.0.0.1:{owner.port}" not in primaries_of(relay))
    assert f"127.0.0.1:{promoted.port}" in primaries_of(relay) and relay.stats.resyncs >= 1
    assert relay.subscriptions.down_since is None and relay.num_clients == 0


async def test_streams_follow_a_primary_killed_and_its_replica_promoted(
        cluster: LocalCluster, relay: Relay) -> None:
    _seen, readers = await streams_under_way(relay)
    owner = cluster.owner_of(relay.live_channel)
    promoted = cluster.replica_of(owner)
    with cluster.client(owner) as client:
        client.execute_command("WAIT", 1, 5000)  # replication is asynchronous: nothing in flight
    cluster.kill(owner)
    await wait_until(lambda: relay.subscriptions.down_since is not None)  # /ready: not ready
    await asyncio.to_thread(cluster.wait_ok)
    # Within a topology read of the promotion, the dead node is no longer counted.
    await wait_until(lambda: relay.subscriptions.down_since is None, timeout=10)
    assert primaries_of(relay) == {f"127.0.0.1:{n.port}" for n in cluster.primary_nodes()}
    assert f"127.0.0.1:{promoted.port}" in primaries_of(relay)
    await streams_end(relay, readers)
    later = asyncio.create_task(collect(relay, "after"))  # a new stream on the new topology
    await wait_until(lambda: relay.subscribed("after"))
    await write(relay.redis, "after", range(3), final_at=2)
    assert [e.index for e in await asyncio.wait_for(later, 30)] == [0, 1, 2]


async def test_a_subscription_refused_with_moved_goes_to_the_node_that_serves_it(
        cluster: LocalCluster) -> None:
    """A channel routed by a stale slot map: the node answers SSUBSCRIBE with MOVED, the relay reads
    the topology again and subscribes the channel where its slot is; the stream misses nothing."""
    relay = Relay(api_redis(Settings(redis_url=cluster.url)), KEYS, api_id="stale")
    subscriptions = relay.subscriptions
    assert isinstance(subscriptions, ShardedSubscriptions)
    await subscriptions.start()  # as Relay.start, with the process channel's route made stale first
    try:
        channel = relay.live_channel
        owner = f"127.0.0.1:{cluster.owner_of(channel).port}"
        subscriptions._routes[channel] = next(name for name in subscriptions._nodes if name != owner)
        await subscriptions.add(channel, relay.router)
        reader = asyncio.create_task(collect(relay, "stale"))
        await wait_until(lambda: subscriptions._routes.get(channel) == owner and relay.subscribed("stale"))
        await write(relay.redis, "stale", range(3), final_at=2, follower="stale")
        assert [e.index for e in await asyncio.wait_for(reader, 30)] == [0, 1, 2]
        assert subscriptions.refreshes >= 1
    finally:
        await relay.stop()
        await relay.redis.aclose()


async def test_a_topology_read_older_than_the_move_is_read_again(
        cluster: LocalCluster, relay: Relay, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node said a channel moved, but the topology (read from another node, not yet told of the
    failover) still names it: the channel stays where it is and waits for a newer read, up to
    STALE_READ_S; past that, the node is taken at its word (it refused while the cluster was down)
    and the channel is subscribed there again, its listeners told RESYNC. The stream misses nothing."""
    subscriptions = relay.subscriptions
    assert isinstance(subscriptions, ShardedSubscriptions)
    channel = relay.live_channel
    reader = asyncio.create_task(collect(relay, "held"))
    await wait_until(lambda: relay.subscribed("held"))
    await write(relay.redis, "held", range(2))
    node = subscriptions._routes[channel]
    monkeypatch.setattr(sharded, "STALE_READ_S", 3600.0)
    subscriptions._on_moved([channel])  # as the node's sunsubscribe does
    await subscriptions.refresh()
    assert channel in subscriptions._moved and relay.subscribed("held") and relay.stats.resyncs == 0
    monkeypatch.setattr(sharded, "STALE_READ_S", 0.0)
    await wait_until(lambda: channel not in subscriptions._moved and relay.stats.resyncs >= 1)
    assert subscriptions._routes[channel] == node
    await wait_until(lambda: relay.subscribed("held"))
    await write(relay.redis, "held", range(2, 4), final_at=3)
    assert [e.index for e in await asyncio.wait_for(reader, 30)] == [0, 1, 2, 3]
