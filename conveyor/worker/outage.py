"""How a worker rides out Redis going away, in two layers, each chosen on purpose.

1. The client's own `Retry` (redis-py), for a dropped connection: reconnect and resend at once,
   at most twice, within ~0.1 s. redis-py 8's `Redis.from_url` retries nothing unless told (only
   `Redis(host=…)` defaults to 10 retries with up to 1 s between them), so `connect` says it here.
2. One loop for outages, `until_up`: anything the client gives up on is retried by the worker at
   its own pace, with a backoff capped by `outage_cap` — well inside the lease, so when Redis is back
   a worker renews its leases long before another worker could take its jobs (docs/design.md §1,
   step 8). Every write the worker retries is idempotent (event IDs follow token indices, the Lua
   scripts check ownership), so repeating a step is safe.
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
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from conveyor.jobqueue.client import make_client
from conveyor.settings import Settings

log = logging.getLogger(__name__)

REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)
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


async def until_up(name: str, attempt: Callable[[], Awaitable[T]], cap: float) -> T:
    """Run `attempt` until it returns, waiting between tries while Redis is unreachable. A try that
    ran for longer than `cap` before it failed begins a new outage (logged anew, backoff reset)."""
    backoff = Backoff(cap)
    down_since: float | None = None
    while True:
        began = time.monotonic()
        try:
            result = await attempt()
        except REDIS_DOWN as exc:
            now = time.monotonic()
            if down_since is None or now - began > cap:
                down_since, backoff = now, Backoff(cap)
                log.warning("%s: Redis unavailable (%s); retrying every %.2fs at most until it is back",
                            name, exc, cap)
            await asyncio.sleep(backoff.delay())
            continue
        # A loop's try returns only when the loop ends (at the drain): then the line would be stale.
        if down_since is not None and time.monotonic() - began < 1.0:
            log.info("%s: Redis reachable again after %.1fs", name, began - down_since)
        return result
