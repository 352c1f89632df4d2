"""The one place that builds a Redis client, for every process (api, worker, webhooks).

`REDIS_URL` names one server, or a cluster's startup nodes as `redis://h1:p1,h2:p2,h3:p3` (user,
password and query as usual; a cluster has only db 0). Cluster mode is the `redis_cluster` setting;
unset, it is detected: several hosts in the URL mean a cluster, else the first host is asked
(`INFO cluster`, which a single node answers too). On a cluster the client is redis-py's
`RedisCluster`: it routes each command by its key's hash slot and splits a non-transactional
pipeline by node. Conveyor's multi-key commands and scripts each touch one slot (tests/worker/test_slots.py).
"""

from __future__ import annotations

import functools
import logging
from typing import Any
from urllib.parse import urlsplit

import redis as sync_redis
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.exceptions import RedisError

from conveyor.settings import Settings

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0


def cluster_of(redis: object) -> bool:
    """Whether a client, or a pipeline of one, talks to a Redis Cluster."""
    return isinstance(redis, RedisCluster | ClusterPipeline)


def split_url(url: str) -> tuple[str, list[tuple[str, int]]]:
    """(the URL of the first host, every host:port) of a URL that may list several hosts."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "6379")
        nodes.append((name.strip("[]"), int(port)))
    first = f"{userinfo}@{hosts.split(',')[0]}" if userinfo else hosts.split(",")[0]
    return parts._replace(netloc=first).geturl(), nodes


@functools.cache
def _detect(url: str) -> bool:
    first, nodes = split_url(url)
    if len(nodes) > 1:
        return True
    try:
        with sync_redis.Redis.from_url(first, socket_timeout=PROBE_TIMEOUT_S,
                                       socket_connect_timeout=PROBE_TIMEOUT_S) as probe:
            return bool(probe.info("cluster").get("cluster_enabled"))
    except (RedisError, OSError) as exc:
        log.warning("could not ask %s whether it is a cluster (%s): using it as a single node; set "
                    "CONVEYOR_REDIS_CLUSTER=true or false to decide without asking", nodes[0][0], exc)
        return False


def is_cluster(settings: Settings) -> bool:
    """Whether this process talks to a Redis Cluster (the setting, else detected once per URL)."""
    if settings.redis_cluster is not None:
        return settings.redis_cluster
    if not settings.redis_url:
        return False
    return _detect(settings.redis_url)


def cluster_client(url: str, **kwargs: Any) -> RedisCluster:
    """redis-py's asyncio cluster client over every startup node of `url`."""
    first, nodes = split_url(url)
    return RedisCluster.from_url(first, startup_nodes=[ClusterNode(h, p) for h, p in nodes[1:]], **kwargs)


def make_client(settings: Settings, **kwargs: Any) -> Redis:
    """The process's asyncio client of `settings.redis_url`: RedisCluster on a cluster (typed as
    Redis: the commands Conveyor uses are the same), a plain client otherwise. `kwargs` go to the
    client (decode_responses, retry, ...); `pool` a ready pool for the single-node case."""
    if not settings.redis_url:
        raise ValueError("set REDIS_URL (or use `conveyor serve`, which starts Redis)")
    pool = kwargs.pop("pool", None)
    if is_cluster(settings):
        return cluster_client(settings.redis_url, **kwargs)  # type: ignore[return-value]
    if pool is not None:
        return Redis.from_pool(pool)
    return Redis.from_url(settings.redis_url, **kwargs)


def make_sync_client(settings: Settings, **kwargs: Any) -> sync_redis.Redis:
    """The blocking client of the webhook processes' own reads (the job record)."""
    if not settings.redis_url:
        raise ValueError("set REDIS_URL (or use `conveyor serve`, which starts Redis)")
    if is_cluster(settings):
        first, nodes = split_url(settings.redis_url)
        startup = [sync_redis.cluster.ClusterNode(h, p) for h, p in nodes[1:]]
        return sync_redis.RedisCluster.from_url(first, startup_nodes=startup, **kwargs)  # type: ignore[return-value]
    return sync_redis.Redis.from_url(settings.redis_url, **kwargs)


def rq_url(settings: Settings) -> str | None:
    """The Redis of RQ (webhook deliveries). RQ does not run on Redis Cluster (its queue, job and
    registry keys are written together in MULTI/EXEC and Lua, across slots; rq/rq#1048), so on a
    cluster it is `webhook_redis_url`, a plain Redis; None: webhooks are off."""
    if settings.webhook_redis_url:
        return settings.webhook_redis_url
    if is_cluster(settings):
        return None
    return settings.redis_url
