"""An idle fleet costs Redis in proportion to its workers (docs/operations/scaling.md#idle-cost): with
four idle worker processes, each affinity owner with its own stream, every worker sends about what a
lone worker sends, not a share that grows with the fleet (one doorbell per shard to block on, one
sweeper at a time). Counted per heartbeat, so a loaded machine's slower timers change nothing.
(`python -m benchmarks.idle_cost` measures the commands per second.)"""

from __future__ import annotations

import asyncio

import pytest

from tests.worker.conftest import Fleet

pytestmark = pytest.mark.slow

BEATS = 8


async def commands_per_beat(fleet: Fleet, beats: int = BEATS) -> float:
    """Commands the server ran per heartbeat of w0 over `beats` of them, this test's own reads
    taken out (INFO counts itself after it answers: the first one is in the difference)."""
    first = int((await fleet.redis.info("stats"))["total_commands_processed"])
    last_beat, seen, own = (await fleet.info("w0")).heartbeat_at, 0, 2
    while seen < beats:
        await asyncio.sleep(0.02)
        beat = (await fleet.info("w0")).heartbeat_at
        own += 1
        if beat != last_beat:
            seen, last_beat = seen + 1, beat
    last = int((await fleet.redis.info("stats"))["total_commands_processed"])
    return (last - first - own) / beats


async def test_an_idle_fleet_costs_redis_in_proportion_to_its_workers(fleet) -> None:  # type: ignore[no-untyped-def]
    fleet.start("w0")
    await fleet.wait_ready()
    await commands_per_beat(fleet, 2)  # past the start-up (group, scripts, first summary)
    alone = await commands_per_beat(fleet)

    fleet.start("w1", "w2", "w3")
    await fleet.wait_ready()
    await commands_per_beat(fleet, 2)
    four = await commands_per_beat(fleet)

    # Before the doorbell and the single sweeper each worker polled every owner's stream and swept
    # every stream: 4.6× a lone worker's commands per worker at 3 workers.
    assert alone > 0 and four / 4 <= 2 * alone, f"{alone:.1f} commands per heartbeat alone, {four:.1f} with 4"
