"""Prefix-affinity placement (docs/design.md §3): which worker already holds a job's prompt prefix.

Each worker publishes a summary of its prefix cache with every heartbeat (Keys.prefixes, TTL one
lease): its block size and the chained hashes (conveyor/jobqueue/prefix_hash.py) of up to SUMMARY_MAX_BLOCKS
cached full blocks. The api hashes a job's prompt the same way and places the job on the own stream
of the worker holding at least `affinity_min_blocks` of its prefix where its prefill finishes
first, weighing the prefix held against the worker's backlog (best_worker); otherwise, and for
the low and batch bands (which must not overtake interactive work by jumping to a worker's own
stream), on the shared streams. Torch-free: the api and the worker both import it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from conveyor.jobqueue.bands import Band
from conveyor.jobqueue.prefix_hash import prefix_hashes

SUMMARY_MAX_BLOCKS = 4096  # about 70 KB of hex per worker per heartbeat
AFFINITY_BANDS = (Band.HIGH, Band.NORMAL)


@dataclass(frozen=True, slots=True)
class PrefixSummary:
    block_size: int
    hashes: frozenset[int]


def encode_summary(block_size: int, hashes: list[int]) -> str:
    """`BLOCK_SIZE HASH HASH …` (hex): compact, one GET per worker, readable in redis-cli."""
    return " ".join([str(block_size), *(f"{h:x}" for h in hashes[:SUMMARY_MAX_BLOCKS])])


def decode_summary(raw: str) -> PrefixSummary | None:
    """None for a value that is not a summary (written by another version): that worker is skipped."""
    head, *rest = raw.split(" ")
    try:
        return PrefixSummary(int(head), frozenset(int(h, 16) for h in rest))
    except ValueError:
        return None


def held_blocks(chain: list[int], summary: PrefixSummary) -> int:
    """How many leading blocks of the job's chain the worker holds: the deepest hash it has (a chained
    hash stands for its whole prefix; the cache evicts a chain's tail before its head)."""
    for depth in range(len(chain), 0, -1):
        if chain[depth - 1] in summary.hashes:
            return depth
    return 0


@dataclass(frozen=True, slots=True)
class WorkerPrefixes:
    """What placement knows of one worker: its summary, and the prompt tokens it has yet to prefill
    (its engine's backlog at its last heartbeat, plus the jobs the api placed on it since)."""

    summary: PrefixSummary
    backlog_tokens: int = 0


def best_worker(prompt_ids: list[int], workers: dict[str, WorkerPrefixes], min_blocks: int,
                rng: random.Random | None = None) -> tuple[str, int] | None:
    """(worker id, blocks held) of the worker where the job's prefill is done soonest, or None: queue
    it on the shared stream.

    Counted in prompt tokens still to compute (Dynamo's KV router weighs the same two terms): the
    part of the prompt a worker does not hold, plus that worker's backlog. Only a worker holding at
    least `min_blocks` of the prompt qualifies, and only if it beats computing the whole prompt on
    the least-loaded worker, which is the one that takes a job from the shared stream first. So a
    worker with the prefix gets the job until its backlog outweighs the prefill it saves, then the
    job goes to whoever has room (ties: one at random, so equal holders share the load)."""
    chains: dict[int, list[int]] = {}
    best: list[tuple[str, int]] = []
    best_cost = 0
    for worker_id, worker in sorted(workers.items()):
        summary = worker.summary
        chain = chains.get(summary.block_size)
        if chain is None:
            chain = chains[summary.block_size] = prefix_hashes(prompt_ids, summary.block_size)
        depth = held_blocks(chain, summary)
        if depth < min_blocks:
            continue
        cost = len(prompt_ids) - depth * summary.block_size + worker.backlog_tokens
        if not best or cost < best_cost:
            best, best_cost = [(worker_id, depth)], cost
        elif cost == best_cost:
            best.append((worker_id, depth))
    if not best:
        return None
    least_loaded = min(worker.backlog_tokens for worker in workers.values())
    if best_cost > len(prompt_ids) + least_loaded:
        return None
    return (rng or random).choice(best)
