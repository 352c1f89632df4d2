"""Cluster mode: how REDIS_URL names a cluster, what is detected, which client each process gets,
and the live-event commands; the last tests start a real 3-node cluster on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from conveyor.jobqueue.client import cluster_of, is_cluster, make_client, make_sync_client, rq_url, split_url
from conveyor.launcher.redis_cluster import LocalCluster
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.settings import Settings


def test_a_url_may_list_several_startup_nodes() -> None:
    assert split_url("redis://:pw@10.0.0.1:7000,10.0.0.2:7001/0") == (
        "redis://:pw@10.0.0.1:7000/0", [("10.0.0.1", 7000), ("10.0.0.2", 7001)])
    assert split_url("rediss://h") == ("rediss://h", [("h", 6379)])


def test_several_hosts_mean_a_cluster_and_the_setting_wins() -> None:
    url = "redis://127.0.0.1:1,127.0.0.1:2"
    assert is_cluster(Settings(redis_url=url))
    assert not is_cluster(Settings(redis_url=url, redis_cluster=False))
    assert is_cluster(Settings(redis_url="redis://127.0.0.1:1", redis_cluster=True))


def test_rq_needs_a_plain_redis_of_its_own_on_a_cluster() -> None:
    cluster = "redis://127.0.0.1:1,127.0.0.1:2"
    assert rq_url(Settings(redis_url=cluster)) is None
    assert rq_url(Settings(redis_url=cluster, webhook_redis_url="redis://q:6379")) == "redis://q:6379"
    assert rq_url(Settings(redis_url="redis://one:6379", redis_cluster=False)) == "redis://one:6379"


async def test_one_node_is_detected_as_one_node(redis_server: EmbeddedRedis | LocalCluster) -> None:
    if isinstance(redis_server, LocalCluster):
        pytest.skip("the session's server is a cluster here")
    settings = Settings(redis_url=redis_server.url)
    assert not is_cluster(settings)
    client = make_client(settings, decode_responses=True)
    assert type(client) is Redis
    assert not cluster_of(client)  # classic pub/sub on one node
    await client.aclose()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with LocalCluster(Path(tmp_path_factory.mktemp("cluster"))) as running:
        yield running


async def test_a_cluster_is_detected_from_one_of_its_nodes(cluster: LocalCluster) -> None:
    settings = Settings(redis_url=f"redis://127.0.0.1:{cluster.port}/0")
    assert is_cluster(settings)
    client = make_client(settings, decode_responses=True)
    assert isinstance(client, RedisCluster)
    assert cluster_of(client)  # sharded pub/sub
    await client.set("conveyor:probe", "1")
    assert len(client.get_primaries()) == 3
    await client.aclose()


async def test_the_cluster_refuses_a_script_that_publishes_to_another_slot(cluster: LocalCluster) -> None:
    """What the layout relies on: SPUBLISH inside a script must stay in the slot of its keys."""
    client = make_client(Settings(redis_url=cluster.url), decode_responses=True)
    script = client.register_script("redis.call('SPUBLISH', ARGV[1], 'm') return 1")
    assert await script(keys=["k:{job1}"], args=["k:{job1}:live"]) == 1
    with pytest.raises(Exception, match="non local key|CROSSSLOT"):
        await script(keys=["k:{job1}"], args=["k:{job2}:live"])
    await client.aclose()


def test_a_cluster_with_replicas_fails_over_by_hand_and_when_a_primary_dies(tmp_path: Path) -> None:
    """3 primaries + 3 replicas: what the failover fault tests (tests/faults/test_cluster_faults.py)
    rely on. A manual failover swaps the roles; a SIGKILLed primary's replica takes over, and the
    dead node, restarted, rejoins as a replica; writes are served again each time."""
    with LocalCluster(tmp_path, nodes=3, replicas=1) as cluster:
        assert len(cluster.primary_nodes()) == 3 and len(cluster.live()) == 6
        client = make_sync_client(Settings(redis_url=cluster.url), decode_responses=True)
        client.set("k:{a}", "1")
        owner = cluster.owner_of("k:{a}")
        replica = cluster.replica_of(owner)
        cluster.failover(replica)
        cluster.wait_ok()
        assert cluster.role(owner) == "slave" and cluster.role(replica) == "master"

        cluster.kill(replica)
        cluster.wait_ok()
        assert cluster.role(owner) == "master"
        restarted = cluster.restart(replica)
        cluster.wait_ok()
        assert cluster.role(restarted) == "slave"
        client.close()
        client = make_sync_client(Settings(redis_url=cluster.url), decode_responses=True)
        assert client.get("k:{a}") == "1"
        client.set("k:{a}", "2")
        client.close()

