"""Every multi-key command, script and transaction of the api's and the worker's real paths touches
keys of one hash slot, so the layout runs on Redis Cluster (docs/design.md §3).

The paths run for real (a worker in this process takes, streams, cancels and ends jobs the api's
JobStore submits, with per-tenant admission and an Idempotency-Key) while every command sent is
recorded: single commands, pipelines and their transaction flag. The server names each command's
keys (`COMMAND GETKEYS`: declared keys of EVALSHA, every stream of XREADGROUP, ...), so a key or
command added later is covered without editing this test. The cluster suite (tests/test_cluster.py)
runs the same code on a 3-node cluster, which also refuses what this cannot see: a script touching
a key (or a shard channel) it did not declare.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio.client import Pipeline, Redis
from redis.cluster import key_slot
from redis.exceptions import ResponseError

from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.placement import best_worker
from conveyor.wire.job import JobStatus
from tests.conftest import CLUSTER

# It records redis-py's single-node client; on the cluster the servers themselves refuse a cross-slot
# command (CROSSSLOT), which the cluster suite's run of the same paths shows.
pytestmark = pytest.mark.skipif(CLUSTER, reason="records the single-node client; the cluster checks itself")

PROMPT = [101, 2024, 318, 257]


def single_node_submit(commands: list[tuple[Any, ...]]) -> bool:
    """A job's record, listing and queue entry in one MULTI: JobStore.enqueue_after sends it so on
    one node only; on a cluster it writes them in order, the record with a provisional TTL."""
    names = [str(args[0]).upper() for args in commands]
    return "HSET" in names and ("XADD" in names or names[-1] == "EVAL")


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, list[tuple[Any, ...]]]]:
    """(transaction, commands) of every command this process sends through redis-py's asyncio client."""
    seen: list[tuple[bool, list[tuple[Any, ...]]]] = []
    execute_command, execute = Redis.execute_command, Pipeline.execute

    async def one(self: Redis, *args: Any, **options: Any) -> Any:
        seen.append((False, [args]))
        return await execute_command(self, *args, **options)

    async def many(self: Pipeline, raise_on_error: bool = True) -> Any:
        seen.append((bool(self.is_transaction), [args for args, _options in self.command_stack]))
        return await execute(self, raise_on_error)

    monkeypatch.setattr(Redis, "execute_command", one)
    monkeypatch.setattr(Pipeline, "execute", many)
    return seen


async def keys_of(redis: Redis, args: tuple[Any, ...], cache: dict[tuple[Any, ...], list[str]]) -> list[str]:
    """The keys of one command, as the server parses them (none for a command without keys)."""
    if args not in cache:
        try:
            cache[args] = list(await redis.command_getkeys(*args))
        except ResponseError:  # no key arguments (PING, PUBLISH, SCRIPT LOAD, ...)
            cache[args] = []
    return cache[args]


async def placed_by_affinity(local, store: JobStore, make_spec) -> None:  # type: ignore[no-untyped-def]
    """A job queued on the worker's own stream (it holds the prompt's prefix): the api's ENQUEUE."""
    prompt = list(range(1000, 1100))
    assert (await local.result((await store.submit(make_spec(prompt, max_new_tokens=2))).job_id)).status \
        is JobStatus.SUCCEEDED
    while best_worker(prompt, store.placement._summaries, local.settings.affinity_min_blocks) is None:
        await asyncio.sleep(0.05)  # until the worker's summary holds it (its heartbeat: 100 ms)
        await store.placement.refresh()
    job = (await store.submit(make_spec(prompt + [7], max_new_tokens=2))).job_id
    assert (await local.result(job)).status is JobStatus.SUCCEEDED
    own = await local.redis.xinfo_stream(local.keys.own_stream(0, "w-slots"))
    assert own["entries-added"] == 1


async def test_every_command_script_and_transaction_touches_one_slot(  # type: ignore[no-untyped-def]
        local, make_spec, redis, recorded) -> None:
    settings = local.settings.model_copy(update={"max_concurrent_requests_per_tenant": 10})
    store = JobStore(local.redis, local.keys, settings)
    async with local.worker("w-slots"):
        done = (await store.submit(make_spec(PROMPT, max_new_tokens=6), idempotency_key="k1")).job_id
        assert (await local.result(done)).status is JobStatus.SUCCEEDED
        await placed_by_affinity(local, store, make_spec)
        running = (await store.submit(make_spec(PROMPT, max_new_tokens=3000))).job_id
        await local.wait_events(running, 3)
        await store.cancel(running)
        assert (await local.result(running)).status is JobStatus.CANCELLED
    queued = (await store.submit(make_spec(PROMPT))).job_id  # no worker now: ended by the api itself
    await store.cancel(queued)
    assert (await local.result(queued)).status is JobStatus.CANCELLED
    await store.queue_places()  # the depth's script, over a shard's bands and own streams
    await asyncio.sleep(0)

    recorded = list(recorded)  # what the checks below send is not recorded
    cache: dict[tuple[Any, ...], list[str]] = {}
    multi_key = scripts = 0
    for transaction, commands in recorded:
        group: set[int] = set()
        for args in commands:
            keys = await keys_of(redis, args, cache)
            slots = {key_slot(str(key).encode()) for key in keys}
            assert len(slots) <= 1, f"{args[0]} touches keys of several slots: {keys}"
            multi_key += len(keys) > 1
            scripts += str(args[0]).upper() == "EVALSHA"
            group |= slots
        if transaction and not single_node_submit(commands):
            assert len(group) <= 1, f"a transaction over several slots: {commands}"
    # The paths ran: the job scripts (record + event stream) and multi-key commands were seen.
    assert scripts > 0 and multi_key > 0, (scripts, multi_key)
