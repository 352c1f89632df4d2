"""The queue's shards over a cluster's primaries (conveyor/jobqueue/keys.py `shard_tag`,
conveyor/jobqueue/spread.py): as even as the counts allow on any even split of the slots, and on a
real 3-node cluster, where the start-up check says so, or names the fix when shards are too few."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
from redis.cluster import key_slot
from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from conveyor.jobqueue.bands import BANDS
from conveyor.jobqueue.client import make_client
from conveyor.jobqueue.keys import Keys, shard_tag
from conveyor.jobqueue.spread import check_spread
from conveyor.launcher.redis_cluster import LocalCluster
from conveyor.settings import Settings


def primary_of(slot: int, primaries: int) -> int:
    """The primary serving `slot` when `primaries` split the slots into equal contiguous ranges."""
    return slot * primaries // REDIS_CLUSTER_HASH_SLOTS


@pytest.mark.parametrize("primaries", [1, 2, 3, 4, 5, 6])
def test_shards_spread_as_evenly_as_the_counts_allow(primaries: int) -> None:
    for shards in range(1, 25):
        keys = Keys("p", jobs_shards=shards)
        held = Counter(primary_of(key_slot(keys.shard_prefix(s).encode()), primaries) for s in range(shards))
        counts = [held.get(p, 0) for p in range(primaries)]
        assert max(counts) - min(counts) <= 1, (shards, counts)
        for shard in range(shards):  # a shard's bands and own streams stay in its one slot
            slots = {key_slot(k.encode()) for k in (*keys.shard_streams(shard), keys.owners(shard),
                                                    keys.own_stream(shard, "w1"))}
            assert len(slots) == 1
    assert shard_tag(0, 1) == "jobs-0" and Keys("p").jobs_stream(0, BANDS[0]) == "p:jobs:{jobs-0}:high"


@pytest.mark.slow
@pytest.mark.cluster
async def test_the_start_check_reads_the_live_cluster(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster:
        redis = make_client(Settings(redis_url=cluster.url, redis_cluster=True), decode_responses=True)
        try:
            with caplog.at_level(logging.INFO, logger="conveyor.jobqueue.spread"):
                six = await check_spread(redis, Keys("p", jobs_shards=6))
                two = await check_spread(redis, Keys("p", jobs_shards=2))
        finally:
            await redis.aclose()
    assert six is not None and sorted(six.values()) == [2, 2, 2]  # hashing jobs-S alone: 3/2/1
    assert two is not None and sorted(two.values()) == [0, 1, 1]
    [ok, few] = caplog.records
    assert ok.levelno == logging.INFO and few.levelno == logging.WARNING
    assert "use 2 of the cluster's 3 primaries" in few.getMessage()
    assert "set jobs_shards to 3" in few.getMessage()
