"""The queue's layout, pure: priority → band, the order a worker reads bands and shards in, the
stream of a job (conveyor/jobqueue/bands.py, conveyor/jobqueue/keys.py)."""

from __future__ import annotations

import uuid
from collections import Counter

from conveyor.jobqueue.bands import BANDS, Band, band_of, fleet_quotas, read_order, shard_order
from conveyor.jobqueue.keys import Keys, shard_tag


def test_priorities_map_onto_bands_cut_at_the_default_and_the_bottom() -> None:
    assert [band_of(p) for p in (100, 50, 1)] == [Band.HIGH] * 3
    assert band_of(0) is Band.NORMAL
    assert [band_of(p) for p in (-1, -50, -99)] == [Band.LOW] * 3
    assert band_of(-100) is Band.BATCH  # the batch runner's level (conveyor/api/batch/lines.py)
    assert {band_of(p, bands=False) for p in range(-100, 101)} == {Band.NORMAL}  # bands off: one stream
    # Higher priority never lands in a lower band: the engine's order holds across the fleet.
    ranks = [BANDS.index(band_of(p)) for p in range(100, -101, -1)]
    assert ranks == sorted(ranks)


def test_reads_start_at_the_highest_band_and_every_kth_one_band_lower_in_turn() -> None:
    k = 4
    orders = {n: read_order(n, k) for n in range(1, 3 * 3 * k + 1)}  # 36 reads: 9 start lower
    assert read_order(0, k) == BANDS
    for order in orders.values():
        assert sorted(order) == sorted(BANDS)  # every read looks at every band
    heads = Counter(order[0] for order in orders.values())
    assert heads == {Band.HIGH: 36 - 9, Band.NORMAL: 3, Band.LOW: 3, Band.BATCH: 3}
    lower = [orders[n][0] for n in (k, 2 * k, 3 * k, 4 * k)]
    assert lower == [Band.NORMAL, Band.LOW, Band.BATCH, Band.NORMAL]
    assert orders[2 * k] == (Band.LOW, Band.BATCH, Band.HIGH, Band.NORMAL)  # then back to the top
    assert {read_order(n, 0) for n in range(50)} == {BANDS}  # 0: strictly highest first


def test_each_read_starts_at_the_next_shard() -> None:
    assert [shard_order(n, 3) for n in range(4)] == [(0, 1, 2), (1, 2, 0), (2, 0, 1), (0, 1, 2)]
    assert shard_order(7, 1) == (0,)


def test_a_job_goes_to_the_stream_of_its_shard_and_band_and_a_shard_has_one_hash_tag() -> None:
    keys = Keys("p", jobs_shards=3)
    assert len(keys.jobs_streams) == len(set(keys.jobs_streams)) == 3 * len(BANDS)
    assert set(keys.fleet_keys) == {*keys.jobs_streams, keys.dead_letter_stream}
    ids = [uuid.uuid4().hex for _ in range(600)]
    shards = Counter(keys.shard_of(job_id) for job_id in ids)
    assert set(shards) == {0, 1, 2} and min(shards.values()) > 120  # spread, roughly evenly
    assert all(keys.shard_of(job_id) == Keys("p", jobs_shards=3).shard_of(job_id) for job_id in ids)  # stable
    job_id = ids[0]
    stream = keys.stream_of(job_id, -100)
    assert stream == keys.jobs_stream(keys.shard_of(job_id), Band.BATCH)
    assert keys.stream_of(job_id, -100, bands=False) == keys.jobs_stream(keys.shard_of(job_id), Band.NORMAL)
    for shard in range(3):  # one slot per shard on Redis Cluster: the bands share the hash tag
        tags = {s[s.index("{"):s.index("}") + 1] for s in keys.shard_streams(shard)}
        assert tags == {f"{{{shard_tag(shard, 3)}}}"}


def test_the_room_goes_in_band_order_across_shards_own_streams_first() -> None:
    # shard → (own stream, bands in read order: high, normal, low, batch)
    waiting = {0: (0, [0, 0, 5, 0]), 1: (0, [2, 0, 0, 0]), 2: (1, [0, 3, 0, 0])}
    assert fleet_quotas(waiting, (0, 1, 2), 4) == {0: 0, 1: 2, 2: 2}  # own 1, high 2, then 1 normal
    assert fleet_quotas(waiting, (0, 1, 2), 7) == {0: 1, 1: 2, 2: 4}  # the low band's turn comes last
    assert fleet_quotas(waiting, (2, 0, 1), 100) == {0: 5, 1: 2, 2: 4}  # all of it: no more than waits
    # Ties go in the read's shard order: each read starts at the next shard.
    even = {0: (0, [0, 3, 0, 0]), 1: (0, [0, 3, 0, 0])}
    assert fleet_quotas(even, (1, 0), 4) == {1: 3, 0: 1}
    assert fleet_quotas(even, (0, 1), 0) == {0: 0, 1: 0}
