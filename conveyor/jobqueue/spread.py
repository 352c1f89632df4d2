"""Where the queue's shards live on a Redis Cluster, checked when the api and each worker start.

Each shard is one slot (conveyor/jobqueue/keys.py `shard_tag`), so a shard's load lands on the primary
serving that slot. The tags spread evenly over primaries that split the slots evenly; what they cannot
help is a cluster whose slots are split unevenly, or fewer shards than primaries. Both are logged
with the fix; neither stops a process, since the queue works either way, only less spread.
"""

from __future__ import annotations

import logging
from collections import Counter

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from conveyor.jobqueue.keys import Keys

log = logging.getLogger(__name__)


async def check_spread(redis: Redis | RedisCluster, keys: Keys) -> dict[str, int] | None:
    """Shards per primary (`host:port` → count, every primary listed), logged; None on one node."""
    if not isinstance(redis, RedisCluster):
        return None
    try:
        await redis.initialize()  # the slot map, if no command has read it yet
        primaries = sorted(node.name for node in redis.get_primaries())
        # get_node_from_key raises SlotNotCoveredError, never answers None as its type says.
        held = Counter(node.name for shard in range(keys.jobs_shards)
                       if (node := redis.get_node_from_key(keys.shard_prefix(shard))) is not None)
    except (RedisError, RedisClusterException) as exc:  # a slot not served now: checked at next start
        log.warning("could not read where the queue's shards live: %s: %s", type(exc).__name__, exc)
        return None
    spread = {name: held.get(name, 0) for name in primaries}
    counts = ", ".join(f"{name}: {count}" for name, count in spread.items())
    if keys.jobs_shards < len(primaries):
        log.warning("the queue's %d shard(s) use %d of the cluster's %d primaries (%s): set jobs_shards to "
                    "%d, or a multiple, to spread the queue over every node", keys.jobs_shards,
                    sum(1 for count in spread.values() if count), len(primaries), counts, len(primaries))
    elif max(spread.values()) - min(spread.values()) > 1:
        log.warning("the queue's %d shards are uneven over the cluster's primaries (%s): its slots are not "
                    "split evenly; rebalance them (valkey-cli --cluster rebalance) so each primary holds "
                    "an equal range", keys.jobs_shards, counts)
    else:
        log.info("the queue's %d shard(s) over the cluster's %d primaries: %s", keys.jobs_shards,
                 len(primaries), counts)
    return spread
