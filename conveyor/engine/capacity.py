"""How many new requests an engine could start now: what a worker reads from the queue.

Reading too few leaves a step part empty while jobs wait in the stream; reading too many queues them
here, where no other worker can take them. So: the free batch slots, bounded by the free blocks (and
batch tokens) at a rough estimate per request, the mean length of the sequences in the engine (one
block when it is idle). While a request the last step could not admit is waiting, only what would
join the next step: none if blocks, batch slots or batch tokens stopped it; if the prefill budget
stopped it, enough requests at the mean prompt length to fill the next step's budget beside the
backlog. (Reading none then, as this did before, ran every other step of an overloaded worker with
its budget part spent while arrivals waited a whole step in the stream; docs/engine.md, "Pull by
capacity", has the figures.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seqs

from conveyor.engine.block_manager import BlockManager
from conveyor.engine.config import EngineConfig
from conveyor.engine.sequence import Sequence


def capacity(
    running: Seqs[Sequence],
    waiting: Seqs[Sequence],
    free_slots: int,
    block_manager: BlockManager,
    config: EngineConfig,
    budget_ahead: int | None,
) -> int:
    """`budget_ahead`: the next step's prefill budget beside the backlog when the last step left a
    request waiting (0: it stopped for want of room, not budget); None when none was left."""
    seqs = [*running, *waiting]
    ahead = None  # requests the next step has prefill budget for
    if budget_ahead is not None and waiting:
        if budget_ahead <= 0:
            return 0
        mean_prompt = sum(s.num_prompt_tokens for s in seqs) / len(seqs)
        ahead = math.ceil(budget_ahead / max(1.0, mean_prompt))
    if free_slots <= 0:
        return 0
    bm = block_manager
    mean_tokens = sum(s.num_tokens for s in seqs) / len(seqs) if seqs else 1.0
    per_request = max(1, bm.blocks_for(int(mean_tokens)))
    queued = sum(bm.blocks_for(s.num_tokens) for s in waiting)
    bound = min(free_slots, max(0, bm.num_free_blocks - queued) // per_request)
    if config.max_batch_total_tokens is not None:
        used = sum(s.num_tokens for s in seqs)
        free_tokens = max(0, config.max_batch_total_tokens - used)
        bound = min(bound, free_tokens // max(1, int(mean_tokens)))
    return bound if ahead is None else min(bound, ahead)
