"""Priority bands of the fleet's queue (docs/design.md §3): which stream a job goes to, and in which
order a worker reads the streams.

`priority` (-100..100, higher first) is mapped onto four bands, one stream each (per shard). The cut
points sit at the default and at the bottom: anything above the default (0) is `high`, the default is
`normal`, anything below it `low`, and -100 — the level of batch lines (conveyor/api/batch/lines.py) —
`batch`.
Cutting at the default keeps the engine's meaning (a higher priority is served first) across the
fleet for the values users set (1, 10, -1, …); the batch band keeps background batch lines from
competing even with interactive low-priority traffic. Inside the engine priority orders as before.

A worker reads the highest non-empty band first. So that lower bands keep moving under a steady
stream of higher ones, every `band_starvation_every`-th read starts one band lower, each lower band
in turn (read 8 starts at normal, read 16 at low, read 24 at batch, with the default 8).
"""

from __future__ import annotations

from enum import StrEnum


class Band(StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"
    BATCH = "batch"


BANDS: tuple[Band, ...] = tuple(Band)  # highest first
# The lowest priority of each band (a band holds priorities from its floor up to the next one's).
BAND_FLOORS: tuple[tuple[Band, int], ...] = ((Band.HIGH, 1), (Band.NORMAL, 0), (Band.LOW, -99),
                                             (Band.BATCH, -100))


def band_of(priority: int, bands: bool = True) -> Band:
    """The band of a job's priority; with bands off (`priority_bands=false`) every job is `normal`."""
    if not bands:
        return Band.NORMAL
    for band, floor in BAND_FLOORS:
        if priority >= floor:
            return band
    return Band.BATCH  # below -100 (the api refuses it; a spec written by hand may hold it)


def read_order(read: int, every: int) -> tuple[Band, ...]:
    """The bands in the order read number `read` (0, 1, 2, …) looks at them.

    Normally highest first. With `every` = K > 0, reads K, 2K, 3K, … start one band lower, the lower
    bands taking turns (normal, low, batch, normal, …), then wrap around to the higher ones: each
    lower band is at the head of one read in K × 3, whatever arrives above it."""
    if every <= 0 or read <= 0 or read % every:
        return BANDS
    start = 1 + (read // every - 1) % (len(BANDS) - 1)
    return BANDS[start:] + BANDS[:start]


def shard_order(read: int, shards: int) -> tuple[int, ...]:
    """The shards in the order read number `read` takes from them: each read starts at the next one."""
    first = read % shards
    return tuple((first + i) % shards for i in range(shards))


def fleet_quotas(waiting: dict[int, tuple[int, list[int]]], shards: tuple[int, ...],
                 room: int) -> dict[int, int]:
    """How many entries to take from each shard so that `room` goes in band order across the shards.

    `waiting[shard]` is (entries on this worker's own stream, entries waiting in each band in the
    read's order). Own streams come first (prefix affinity placed those jobs here), then band by band,
    each band over the shards in `shards`' order. A shard's quota is thus a prefix of its own read
    order, which its READ takes highest band first: the fleet reads as one queue."""
    quota = dict.fromkeys(shards, 0)
    left = room
    ranks = max((len(bands) for _own, bands in waiting.values()), default=0)
    for rank in range(-1, ranks):  # -1: the own streams
        for shard in shards:
            own, bands = waiting.get(shard, (0, []))
            n = own if rank < 0 else (bands[rank] if rank < len(bands) else 0)
            take = min(max(n, 0), left)
            quota[shard] += take
            left -= take
    return quota
