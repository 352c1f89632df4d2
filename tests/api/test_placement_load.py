"""The api's placement weighs a worker's backlog against the prefix it holds
(conveyor/api/jobpath/placement.py): a
burst of jobs with one prefix goes to its holder until what the api placed there since the last
heartbeat outweighs the prefill it saves; then to the shared stream; a fresh heartbeat resets it.
A real valkey-server; the fleet's view is set by hand, no worker runs."""

from __future__ import annotations

import time
import uuid

from conveyor.api.jobpath.placement import Placement
from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.placement import PrefixSummary, WorkerPrefixes
from conveyor.jobqueue.prefix_hash import prefix_hashes
from conveyor.settings import Settings
from conveyor.wire.job import JobSpec, SamplingSpec, StoppingSpec

BS = 16
SYSTEM = [1000 + i for i in range(8 * BS)]  # 8 blocks the holder has cached


def job(i: int) -> JobSpec:
    # 64 tokens of its own after the system prompt: 64 to compute on the holder, 192 elsewhere
    own = [5000 + 64 * i + j for j in range(64)]
    return JobSpec(id=uuid.uuid4().hex, created_at=time.time(), prompt_ids=SYSTEM + own,
                   sampling=SamplingSpec(), stopping=StoppingSpec(max_new_tokens=1))


async def test_a_burst_spreads_once_the_holder_s_backlog_outweighs_its_prefix(redis) -> None:  # type: ignore[no-untyped-def]
    keys = Keys(f"t{uuid.uuid4().hex[:6]}")
    placement = Placement(redis, keys, Settings(key_prefix=keys.prefix, affinity_min_blocks=4))
    for worker in ("holder", "idle"):  # the own streams exist (their workers created them)
        await redis.xadd(keys.own_stream(0, worker), {"x": "1"})

    def fleet_at_heartbeat() -> None:
        placement._summaries = {
            "holder": WorkerPrefixes(PrefixSummary(BS, frozenset(prefix_hashes(SYSTEM + [0], BS))), 0),
            "idle": WorkerPrefixes(PrefixSummary(BS, frozenset()), 0),
        }
        placement._read_at = time.monotonic()  # fresh: no refresh from Redis during the test

    async def place(i: int) -> str | None:
        pipe = redis.pipeline(transaction=False)
        worker = placement.enqueue(pipe, job(i), {"spec": "{}"})
        await pipe.execute()
        return worker

    fleet_at_heartbeat()
    # holder: 64 + 64 per job placed there so far; elsewhere 192 + 0
    assert [await place(i) for i in range(4)] == ["holder", "holder", "holder", None]
    assert await redis.xlen(keys.own_stream(0, "holder")) == 1 + 3
    assert await redis.xlen(keys.own_stream(0, "idle")) == 1  # never placed where nothing is held
    fleet_at_heartbeat()  # the next heartbeat: the holder took them, its backlog is what it says
    assert await place(4) == "holder"
