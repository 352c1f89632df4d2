"""How a worker rides out Redis going away or refusing, in two layers, each chosen on purpose.

1. The client's own `Retry` (redis-py), for a dropped connection: reconnect and resend at once,
   at most twice, within ~0.1 s. redis-py 8's `Redis.from_url` retries nothing unless told (only
   `Redis(host=…)` defaults to 10 retries with up to 1 s between them), so `connect` says it here.
2. One loop for outages, `until_up`: every transient error (conveyor/jobqueue/redis_errors.py: a
   lost connection, but also a full Redis, a cluster node down or failing over, a server loading)
   is retried by the worker at its own pace, with a backoff capped by `outage_cap` — well inside
   the lease, so when Redis is back a worker renews its leases long before another worker could
   take its jobs (docs/design.md §1, step 8). Every write the worker retries is idempotent (event
   IDs follow token indices, the Lua scripts check ownership), so repeating a step is safe. A
   permanent error (a wrong password, a key of the wrong type) is raised with the fix it needs.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from conveyor.jobqueue.client import make_client
from conveyor.jobqueue.redis_errors import fix_for, is_redis_error, is_transient
from conveyor.settings import Settings

log = logging.getLogger(__name__)

FIRST_DELAY_S = 0.05

T = TypeVar("T")


def client_retry() -> Retry:
    return Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.05), retries=2)


def connect(settings: Settings) -> Redis:
    """The worker's Redis client (RedisCluster on a cluster: conveyor/jobqueue/client.py): redis-py's retry
    for a dropped connection, nothing longer."""
    return make_client(settings, decode_responses=True, retry=client_retry())


def outage_cap(settings: Settings) -> float:
    """Longest wait between two tries while Redis is down: half a heartbeat (a heartbeat is at most
    a third of the lease), and never more than a quarter of the lease."""
    return min(settings.heartbeat_interval_ms / 2, settings.job_lease_ms / 4) / 1000


class Backoff:
    """50 ms, doubling, at most `cap`, each wait 50-100 % of that (a fleet reconnecting at once
    does not retry in lockstep)."""

    def __init__(self, cap: float) -> None:
        self.cap = cap
        self._next = min(FIRST_DELAY_S, cap)

    def delay(self) -> float:
        base, self._next = self._next, min(self._next * 2, self.cap)
        return base * random.uniform(0.5, 1.0)


class RedisMisconfigured(RuntimeError):
    """A permanent Redis error: retrying cannot help, the message names the fix."""


async def until_up(name: str, attempt: Callable[[], Awaitable[T]], cap: float,
                   on_error: Callable[[BaseException], object] | None = None) -> T:
    """Run `attempt` until it returns, waiting between tries while Redis cannot serve (a transient
    error, each one also handed to `on_error`: the worker's metrics). A try that ran for longer than
    `cap` before it failed begins a new outage (logged anew, backoff reset). A permanent Redis error
    raises RedisMisconfigured."""
    backoff = Backoff(cap)
    down_since: float | None = None
    while True:
        began = time.monotonic()
        try:
            result = await attempt()
        except Exception as exc:
            if not is_transient(exc):
                if is_redis_error(exc):
                    raise RedisMisconfigured(f"{name}: Redis answered {exc!r}: {fix_for(exc)}") from exc
                raise
            if on_error is not None:
                on_error(exc)
            now = time.monotonic()
            if down_since is None or now - began > cap:
                down_since, backoff = now, Backoff(cap)
                log.warning("%s: Redis cannot serve (%s: %s); retrying every %.2fs at most until it can",
                            name, type(exc).__name__, exc, cap)
            await asyncio.sleep(backoff.delay())
            continue
        # A loop's try returns only when the loop ends (at the drain): then the line would be stale.
        if down_since is not None and time.monotonic() - began < 1.0:
            log.info("%s: Redis serves again after %.1fs", name, began - down_since)
        return result
