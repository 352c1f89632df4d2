"""One fixed workload through W real worker processes on one Redis, with the Redis counters read
before and after: what the job path costs Redis (benchmarks/redis_cost.py reports it; the test
tests/worker/test_redis_cost.py checks the same run loses and duplicates nothing).

The jobs are written as the api writes them (conveyor.api.jobpath.store.JobStore: admission + record +
stream entry), then the workers run them; nobody follows them, as async jobs (no relay, no SSE client:
no live PUBLISH, and their events go out every `durable_interval_ms`). The counters are the server's
own: `INFO commandstats` (calls and µs per command), `INFO stats` total_commands_processed,
total_net_input_bytes / total_net_output_bytes, and total_reads_processed: the read events the server
handled, one per request the client sent (a pipeline is one), i.e. the round trips. The bench's own
polling (XLEN) and INFO calls are counted on its side and taken out. On a cluster (`cluster`, REDIS_URL
listing the startup nodes) the bench talks through the processes' own client factory
(conveyor.jobqueue.client.make_client) and the counters are summed over every node.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis

from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.client import make_client, split_url
from conveyor.jobqueue.keys import Keys
from conveyor.settings import Settings
from conveyor.wire.event_batch import events_after
from conveyor.wire.job import JobSpec, JobStatus, RecordField, SamplingSpec, StoppingSpec

REPO = Path(__file__).resolve().parents[1]
IDLE_S = 2.0  # the idle window: what ready workers cost Redis with no job (heartbeats, blocked reads)


@dataclass
class Counters:
    calls: dict[str, int]  # command → calls
    usec: dict[str, int]  # command → µs of server time
    commands: int
    bytes_in: int
    bytes_out: int
    round_trips: int
    cpu_s: float  # the server's CPU seconds (INFO cpu: used_cpu_user + used_cpu_sys)

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            {k: v - other.calls.get(k, 0) for k, v in self.calls.items() if v - other.calls.get(k, 0)},
            {k: v - other.usec.get(k, 0) for k, v in self.usec.items() if v - other.usec.get(k, 0)},
            self.commands - other.commands,
            self.bytes_in - other.bytes_in,
            self.bytes_out - other.bytes_out,
            self.round_trips - other.round_trips,
            self.cpu_s - other.cpu_s,
        )

    def without(self, own: dict[str, int]) -> Counters:
        """Less the bench's own commands (command → calls), one round trip each."""
        calls = {k: v - own.get(k, 0) for k, v in self.calls.items() if v - own.get(k, 0) > 0}
        n = sum(own.values())
        return Counters(
            calls,
            self.usec,
            self.commands - n,
            self.bytes_in,
            self.bytes_out,
            self.round_trips - n,
            self.cpu_s,
        )


def node_urls(url: str) -> list[str]:
    """One URL per server of `url` (a cluster's REDIS_URL lists its nodes), for their own INFO."""
    first, nodes = split_url(url)
    return [first] if len(nodes) == 1 else [f"redis://{host}:{port}/0" for host, port in nodes]


async def read_counters(nodes: list[Redis]) -> Counters:
    """Three INFO calls per node (counted by the next read; `without` drops them), summed over nodes."""
    total = Counters({}, {}, 0, 0, 0, 0, 0.0)
    for redis in nodes:
        stats = await redis.info("stats")
        cpu = await redis.info("cpu")
        commandstats = await redis.info("commandstats")
        for k, v in commandstats.items():
            name = k.removeprefix("cmdstat_")
            total.calls[name] = total.calls.get(name, 0) + int(v["calls"])
            total.usec[name] = total.usec.get(name, 0) + int(v["usec"])
        total.commands += int(stats["total_commands_processed"])
        total.bytes_in += int(stats["total_net_input_bytes"])
        total.bytes_out += int(stats["total_net_output_bytes"])
        total.round_trips += int(stats["total_reads_processed"])
        total.cpu_s += float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    return total


@dataclass
class Run:
    workers: int
    jobs: int
    tokens: int  # generated tokens, all jobs
    seconds: float  # first submit to last acknowledgement
    cost: Counters  # the workload (idle cost included for its duration)
    idle: Counters  # the same workers over IDLE_S with nothing to do
    owners: dict[str, str] = field(default_factory=dict)  # job id → the worker that ran it
    lost: list[str] = field(default_factory=list)  # jobs not succeeded: 'id (status)'
    bad_events: dict[str, list[int]] = field(default_factory=dict)  # job id → indices if not 0..n-1


def new_spec(prompt: int, tokens: int, i: int) -> JobSpec:
    """A greedy job of exactly `tokens` tokens (EOS ignored), its prompt distinct per job."""
    return JobSpec(
        id=uuid.uuid4().hex,
        created_at=time.time(),
        prompt_ids=[1000 + (i * 7 + k) % 30000 for k in range(prompt)],
        stopping=StoppingSpec(max_new_tokens=tokens, ignore_eos=True),
        sampling=SamplingSpec(),
    )


def worker_env(redis_url: str, prefix: str, model_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")},
        "REDIS_URL": redis_url,
        "CONVEYOR_MODEL": str(model_dir),
        "CONVEYOR_KEY_PREFIX": prefix,
        "CONVEYOR_KV_CACHE_MEMORY": "64MiB",
        "CONVEYOR_WORKER_METRICS_PORT": "0",
        "CONVEYOR_LOG_LEVEL": "warning",
        "OMP_NUM_THREADS": "1",
        **extra,
    }


async def run_workload(
    redis_url: str,
    model_dir: Path,
    log_dir: Path,
    workers: int,
    jobs: int,
    tokens: int,
    prompt: int = 16,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    cluster: bool = False,
    jobs_shards: int = 1,
) -> Run:
    """`cluster`: REDIS_URL is a cluster's (its workers get CONVEYOR_REDIS_CLUSTER=true);
    `jobs_shards`: the queue's shards (CONVEYOR_JOBS_SHARDS), the same for the bench and workers."""
    prefix = f"cost{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix, jobs_shards)
    settings = Settings(redis_url=redis_url, key_prefix=prefix, max_concurrent_requests=1_000_000,
                        redis_cluster=cluster, jobs_shards=jobs_shards)
    env = {**(env or {}), "CONVEYOR_REDIS_CLUSTER": str(cluster).lower(),
           "CONVEYOR_JOBS_SHARDS": str(jobs_shards)}
    own = len(node_urls(redis_url))  # INFO calls come 3 per node
    nodes = [Redis.from_url(url) for url in node_urls(redis_url)]
    procs: list[subprocess.Popen[bytes]] = []
    async with make_client(settings, decode_responses=True) as redis:
        try:
            for i in range(workers):
                log = open(log_dir / f"{prefix}-w{i}.log", "ab")  # noqa: SIM115 - closed with the process
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "conveyor", "worker", "--worker-id", f"w{i}"],
                        env=worker_env(redis_url, prefix, model_dir, env),
                        cwd=REPO,
                        stdout=log,
                        stderr=log,
                    )
                )
            await _wait_heartbeats(redis, keys, procs, log_dir, timeout)
            # Warm up, not counted: the workers' first steps, and the client's connection pool (one
            # connection per concurrent submit, as a warm api has).
            await _run_jobs(
                redis, keys, settings, [new_spec(prompt, 1, -1 - i) for i in range(jobs)], timeout
            )
            start = await read_counters(nodes)
            await asyncio.sleep(IDLE_S)
            idle = (await read_counters(nodes) - start).without({"info": 3 * own})
            specs = [new_spec(prompt, tokens, i) for i in range(jobs)]
            before = await read_counters(nodes)
            t0 = time.monotonic()
            polls = await _run_jobs(redis, keys, settings, specs, timeout)
            seconds = time.monotonic() - t0
            cost = (await read_counters(nodes) - before).without({"info": 3 * own, "xlen": polls})
            run = Run(workers, jobs, jobs * tokens, seconds, cost, idle)
            await _check(redis, keys, specs, tokens, run)
            return run
        finally:
            stop_workers(procs)
            for node in nodes:
                await node.aclose()


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every worker still running (they drain at once: nothing runs), then waits."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _wait_heartbeats(
    redis: Redis, keys: Keys, procs: list[subprocess.Popen[bytes]], log_dir: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    for i, proc in enumerate(procs):
        while not await redis.exists(keys.worker(f"w{i}")):
            if proc.poll() is not None or time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-3000:] for p in sorted(log_dir.glob("*.log")))
                raise RuntimeError(f"worker w{i} did not come up (exit {proc.returncode}):\n{logs}")
            await asyncio.sleep(0.1)


async def _run_jobs(
    redis: Redis, keys: Keys, settings: Settings, specs: list[JobSpec], timeout: float
) -> int:
    """Submits every job at once, then polls until the workers acknowledged all of them (an
    acknowledged entry is deleted from its stream: the XLEN of every jobs stream sums to 0);
    returns the XLEN commands sent (one round trip each)."""
    store = JobStore(redis, keys, settings)
    # As async jobs: no api follows them (no live publish; their events every durable interval).
    await asyncio.gather(*(store.submit(spec, followed=False) for spec in specs))
    deadline = time.monotonic() + timeout
    polls = 0
    while True:
        queued = 0
        for stream in keys.jobs_streams:  # one by one: one command, one round trip each
            polls += 1
            queued += await redis.xlen(stream)
        if queued == 0:
            return polls
        if time.monotonic() > deadline:
            raise RuntimeError(f"jobs not all done within {timeout}s")
        await asyncio.sleep(0.1)


async def _check(redis: Redis, keys: Keys, specs: list[JobSpec], tokens: int, run: Run) -> None:
    """Each job: succeeded, its events' indices exactly 0..tokens-1; who ran it."""
    for spec in specs:
        record = await redis.hgetall(keys.job(spec.id))
        if record.get(RecordField.STATUS) != JobStatus.SUCCEEDED.value:
            run.lost.append(f"{spec.id} ({record.get(RecordField.STATUS, 'no record')})")
            continue
        run.owners[spec.id] = record[RecordField.WORKER]
        entries = await redis.xrange(keys.events(spec.id))
        indices = [event.index for event in events_after(entries, -1)]
        if indices != list(range(tokens)):
            run.bad_events[spec.id] = indices
