"""What the api knows of the worker fleet: the live workers' heartbeats (each key lives for one lease
after the worker's last beat), read for readiness, `/info` and the console's overview."""

from __future__ import annotations

from conveyor.api.context import ApiContext
from conveyor.api.errors import REDIS_FAULTS
from conveyor.wire.health import Ready
from conveyor.wire.heartbeat import WorkerInfo


async def heartbeat_keys(ctx: ApiContext) -> list[str]:
    """The workers' heartbeat keys (each lives for one lease after the worker's last beat)."""
    return [key async for key in ctx.jobs.redis.scan_iter(match=ctx.jobs.keys.workers_pattern, count=1000)]


async def ready_state(ctx: ApiContext) -> Ready:
    """Redis answers and at least one worker heartbeat is live."""
    try:
        await ctx.jobs.redis.ping()
        workers = len(await heartbeat_keys(ctx))
    except REDIS_FAULTS as exc:
        return Ready(status="not_ready", redis=False, workers=0, reason=f"Redis does not answer: {exc}")
    if workers == 0:
        return Ready(status="not_ready", redis=True, workers=0, reason="no worker heartbeat")
    return Ready(status="ready", redis=True, workers=workers)


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
