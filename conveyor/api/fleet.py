"""What the api knows of the worker fleet: the live workers' heartbeats (each key lives for one lease
after the worker's last beat), read for readiness, `/info` and the console's overview."""

from __future__ import annotations

import time

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from conveyor.api.context import ApiContext
from conveyor.api.errors import REDIS_FAULTS
from conveyor.wire.health import Ready
from conveyor.wire.heartbeat import WorkerInfo

_NOT_WRITABLE: tuple[type[BaseException], ...] = (*REDIS_FAULTS, RedisClusterException)
PROBE_TTL_S = 60  # the readiness probe's key outlives a few probes, then goes with its api


async def heartbeat_keys(ctx: ApiContext) -> list[str]:
    """The workers' heartbeat keys (each lives for one lease after the worker's last beat)."""
    return [key async for key in ctx.jobs.redis.scan_iter(match=ctx.jobs.keys.workers_pattern, count=1000)]


async def failing_primaries(redis: Redis) -> list[str]:
    """On a cluster, the primaries that do not say `cluster_state:ok` (they refuse their slots with
    CLUSTERDOWN: a primary just restarted waits a moment before it serves); none on one node."""
    if not isinstance(redis, RedisCluster):
        return []
    infos = await redis.cluster_info(target_nodes=RedisCluster.PRIMARIES)
    return sorted(name for name, info in infos.items() if info.get("cluster_state") != "ok")


async def ready_state(ctx: ApiContext) -> Ready:
    """What a request needs, in O(1) of the keyspace: Redis accepts a write (a probe key of this
    process, refused at maxmemory, on a demoted primary, by a cluster that is down), on a cluster
    every primary serves its slots (the probe key lives on one), and the relay is subscribed (not
    reconnecting after a restart or failover). The live workers are counted from the heartbeat index
    (ZCOUNT over the last lease, by the workers' clocks) and reported; none does not make the api
    unready."""
    relay = ctx.relay.subscriptions.down_since is None
    redis = ctx.jobs.redis
    keys = ctx.jobs.keys
    now = time.time()
    try:
        await redis.set(keys.api_probe(ctx.api_id), int(now), ex=PROBE_TTL_S)
        failing = await failing_primaries(redis)
    except _NOT_WRITABLE as exc:
        return Ready(status="not_ready", redis=False, relay=relay, workers=-1,
                     reason=f"Redis does not accept writes: {type(exc).__name__}: {exc}")
    if failing:
        return Ready(status="not_ready", redis=False, relay=relay, workers=-1,
                     reason=f"the cluster is down on {', '.join(failing)}: requests for its slots are "
                     "refused")
    try:
        workers = await redis.zcount(keys.worker_beats, now - ctx.settings.job_lease_ms / 1000, "+inf")
    except REDIS_FAULTS:
        workers = -1
    if not relay:
        return Ready(status="not_ready", redis=True, relay=False, workers=workers,
                     reason="the relay is reconnecting to Redis: live events would be missed")
    reason = "no worker heartbeat: jobs wait in the queue until a worker starts" if workers == 0 else None
    return Ready(status="ready", redis=True, relay=True, workers=workers, reason=reason)


async def live_workers(ctx: ApiContext) -> list[WorkerInfo]:
    """What the live workers say of themselves; none when Redis does not answer."""
    try:
        keys = await heartbeat_keys(ctx)
        pipe = ctx.jobs.redis.pipeline(transaction=False)  # not MGET: on a cluster the keys span slots
        for key in keys:
            pipe.get(key)
        raws = await pipe.execute() if keys else []
    except REDIS_FAULTS:
        return []
    infos = []
    for raw in raws:
        try:
            infos.append(WorkerInfo.model_validate_json(raw or ""))
        except ValueError:  # gone since the scan, or not a worker's heartbeat
            continue
    return infos
