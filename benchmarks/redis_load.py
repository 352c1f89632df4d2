"""The single-node op rate of the job path's command mix, with redis-py pipelines (valkey-benchmark
is not shipped): client processes replay what the api and a worker send for each job, with the
real code and scripts: JobStore.submit (admission script, record, entry on the job's stream:
Keys.stream_of), XREADGROUP of those streams (one per shard), the worker's TAKE script, then per
step one pipeline with one call of the APPEND script for the batch of jobs (per job: HMGET + XADD
inside it) and one live message to the api that follows them all (PUBLISH, SPUBLISH on a cluster;
one token per entry, every job followed: the per-token worst case, no stream or durable interval
coalescing), the final APPEND (record, TTLs), XACK + XDEL on each job's stream.
The client is the processes' own (conveyor.jobqueue.client.make_client), so a cluster's URL (its nodes
listed) runs the load on the cluster, the counters summed over its nodes. Heartbeats and lease
renewals (time-based, a few commands a second per worker) are left out.

The clients here share the machine with the server, so the server may not reach 100 % of a core:
the rate at saturation is the measured one scaled by the server's CPU (INFO cpu), commands per
server CPU second; both are reported.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
import uuid
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

from redis.asyncio import Redis

from benchmarks.redis_fleet import node_urls
from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.client import make_client
from conveyor.jobqueue.keys import WORKER_GROUP, Keys
from conveyor.jobqueue.pubsub.publish import publish_to_followers
from conveyor.jobqueue.queue import ensure_group
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.settings import Settings
from conveyor.wire.event_batch import dump_events
from conveyor.wire.job import (
    EventToken,
    JobEvent,
    JobResult,
    JobSpec,
    JobStatus,
    RecordField,
    StoppingSpec,
    Usage,
)

FOLLOWER = "load-api"  # the api process that follows every job


@dataclass
class Load:
    seconds: float
    tokens: int
    commands: int  # as the server counts them (script-internal commands included)
    cpu_s: float  # server CPU seconds
    batch: int  # jobs per pipeline (per step)

    @property
    def commands_per_cpu_s(self) -> float:
        return self.commands / self.cpu_s

    @property
    def utilization(self) -> float:
        return self.cpu_s / self.seconds


async def _client(url: str, seconds: float, batch: int, tokens: int, prompt: int) -> int:
    keys = Keys(f"load{uuid.uuid4().hex[:8]}")
    settings = Settings(redis_url=url, key_prefix=keys.prefix, max_concurrent_requests=1_000_000_000,
                        redis_cluster=len(node_urls(url)) > 1)
    done, cluster = 0, settings.redis_cluster
    async with make_client(settings, decode_responses=True) as redis:
        store, scripts = JobStore(redis, keys, settings), Scripts(redis)
        await scripts.load()
        await ensure_group(redis, keys)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            specs = [
                JobSpec(
                    id=uuid.uuid4().hex,
                    created_at=time.time(),
                    prompt_ids=list(range(1, prompt + 1)),
                    stopping=StoppingSpec(max_new_tokens=tokens),
                )
                for _ in range(batch)
            ]
            await asyncio.gather(*(store.submit(spec) for spec in specs))
            # The streams the jobs went to, read as a worker does: one XREADGROUP per shard (a
            # shard's bands share its slot).
            by_shard: dict[int, set[str]] = {}
            for spec in specs:
                stream = keys.stream_of(spec.id, spec.priority, settings.priority_bands)
                by_shard.setdefault(keys.shard_of(spec.id), set()).add(stream)
            entries: dict[str, list[str]] = {}
            for streams in by_shard.values():
                read = await redis.xreadgroup(WORKER_GROUP, "load", dict.fromkeys(streams, ">"), count=batch)
                for stream, got in read:
                    entries.setdefault(stream, []).extend(entry_id for entry_id, _ in got)
            now = time.time()
            pipe = redis.pipeline(transaction=False)
            for spec in specs:
                scripts.call(pipe, "take", [keys.job(spec.id)], ["load", 1, 1, 0, now])
                pipe.hset(keys.job(spec.id), RecordField.WATCHED, FOLLOWER)  # a client follows it: live
            await pipe.execute()
            for index in range(tokens):
                pipe = redis.pipeline(transaction=False)
                final = index == tokens - 1
                result = (
                    JobResult(
                        status=JobStatus.SUCCEEDED,
                        finish_reason="length",
                        generated_text=" word" * tokens,
                        usage=Usage(prompt_tokens=prompt, completion_tokens=tokens),
                    )
                    if final
                    else None
                )
                event = JobEvent(index=index, token=EventToken(id=1000 + index, text=" word"), final=final,
                                 result=result, at=round(now, 3))
                # One APPEND call per step for the batch (a job's keys share its slot, not the batch's:
                # on a cluster one call per job), the record 60 s, the events 60 s.
                calls = [specs] if not cluster else [[spec] for spec in specs]
                events = dump_events([event])
                for group in calls:
                    job_keys: list[str] = []
                    args: list[object] = ["load", 1000, now, 60, 60]
                    for spec in group:
                        job_keys += [keys.job(spec.id), keys.events(spec.id)]
                        args += [f"0-{index + 1}", events, int(index == 0), int(final),
                                 result.status.value if result else "",
                                 result.model_dump_json() if result else "", index]
                    scripts.call(pipe, "append", job_keys, args)
                publish_to_followers(pipe, keys, {FOLLOWER: {spec.id: events for spec in specs}})
                await pipe.execute()
            pipe = redis.pipeline(transaction=False)
            for stream, ids in entries.items():
                pipe.xack(stream, WORKER_GROUP, *ids)
                pipe.xdel(stream, *ids)
            await pipe.execute()
            done += batch * tokens
    return done


def _run_client(args: tuple[str, float, int, int, int], ready: Event, start: Event, out: Queue) -> None:
    """One client process: imported and connected first, then the load from `start` on."""
    ready.set()
    start.wait()
    out.put(asyncio.run(_client(*args)))


async def _server(url: str) -> tuple[int, float]:
    """(commands, CPU seconds) of the server, summed over a cluster's nodes."""
    commands, cpu_s = 0, 0.0
    for node in node_urls(url):
        async with Redis.from_url(node) as redis:
            stats, cpu = await redis.info("stats"), await redis.info("cpu")
        commands += int(stats["total_commands_processed"])
        cpu_s += float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    return commands, cpu_s


def _result(out: Queue, procs: list[multiprocessing.process.BaseProcess]) -> int:
    """One client's token count; a client that died (its traceback is above) fails the load instead
    of leaving it waiting forever."""
    while True:
        try:
            return int(out.get(timeout=1))
        except queue.Empty:
            if any(proc.exitcode not in (None, 0) for proc in procs):
                raise RuntimeError("a load client failed (its traceback is above)") from None


def measure(
    url: str, seconds: float = 10.0, clients: int = 3, batch: int = 16, tokens: int = 64, prompt: int = 16
) -> Load:
    """`clients` processes, each `batch` jobs of `tokens` tokens at a time, for about `seconds`;
    the server's counters read once every client is up, so only the load is counted."""
    context = multiprocessing.get_context("spawn")
    out: Queue = context.Queue()
    start = context.Event()
    procs = []
    for _ in range(clients):
        ready = context.Event()
        proc = context.Process(
            target=_run_client, args=((url, seconds, batch, tokens, prompt), ready, start, out)
        )
        proc.start()
        ready.wait()
        procs.append(proc)
    commands0, cpu0 = asyncio.run(_server(url))
    t0 = time.monotonic()
    start.set()
    tokens_done = sum(_result(out, procs) for _ in procs)
    elapsed = time.monotonic() - t0
    for proc in procs:
        proc.join()
    commands1, cpu1 = asyncio.run(_server(url))
    own = 2 * len(node_urls(url))  # the first read's INFO calls, counted by the second
    return Load(elapsed, tokens_done, commands1 - commands0 - own, cpu1 - cpu0, batch)
