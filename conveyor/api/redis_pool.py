"""The api process's Redis client: one blocking connection pool, sized by the settings.

redis-py's default pool fails at once when a burst has every connection busy (MaxConnectionsError,
which reached clients as a 500); a blocking pool makes the request wait for a free connection, up to
`redis_pool_timeout`, and then raises redis' ConnectionError, which the app answers with 503 and
Retry-After. A request holds a connection only for each command (SSE clients hold none: they share
the relay's one pub/sub connection, which has its own pool), so the default of twice
max_concurrent_requests, at least 32, leaves room for the refused requests of a burst too.

A client made by `Redis.from_url` has no retries in redis-py 8: after a Redis restart, the first
command on each pooled connection fails on its dead socket. One immediate redial (REDIALS) hides
that, and nothing more: while Redis is down a request fails at once (503), it does not hang in
hidden retries.

On Redis Cluster (conveyor/jobqueue/client.py) the client is redis-py's RedisCluster, which keeps a pool per
node of `pool_size` connections; it has no blocking pool, so a node's exhausted pool answers at once
with MaxConnectionsError (a ConnectionError: 503 and Retry-After too).
"""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from conveyor.jobqueue.client import is_cluster, make_client
from conveyor.settings import Settings

MIN_POOL = 32
REDIALS = 1


def pool_size(settings: Settings) -> int:
    return settings.redis_max_connections or max(MIN_POOL, 2 * settings.max_concurrent_requests)


def api_redis(settings: Settings) -> Redis:
    """The api's client of `settings.redis_url`, strings decoded, over a blocking pool."""
    if not settings.redis_url:
        raise ValueError("the api needs REDIS_URL (`conveyor serve` sets it for you)")
    if is_cluster(settings):
        return make_client(settings, max_connections=pool_size(settings), decode_responses=True,
                           retry=Retry(NoBackoff(), REDIALS))
    pool = BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=pool_size(settings), timeout=settings.redis_pool_timeout,
        decode_responses=True, retry=Retry(NoBackoff(), REDIALS),
    )
    return make_client(settings, pool=pool)
