"""What `submit_replicas` costs a submit: the api's JobStore.submit on a primary with one replica on
loopback, without WAIT (0) and with it (1), interleaved.

    python -m benchmarks.submit_replicas                  # 3 pairs of 300 submits each
    python -m benchmarks.submit_replicas --pairs 5 --jobs 500

Each leg submits `--jobs` jobs one after another (a 64-token prompt, as a small chat turn) through
the real submit path (admission, tenant index, record and queue entry in one MULTI, then WAIT with
the setting), then empties the keys. Legs alternate A B A B …, so the machine's drift hits both;
the table gives each leg's median and p99 submit latency and the median B/A ratio with its range.
On loopback the replica is as near as it gets: across zones, add the round trip between them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from redis.asyncio import Redis

from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.keys import Keys
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.settings import Settings
from conveyor.wire.job import JobSpec, SamplingSpec, StoppingSpec


def spec() -> JobSpec:
    return JobSpec(id=uuid.uuid4().hex, created_at=time.time(), prompt_ids=list(range(1000, 1064)),
                   stopping=StoppingSpec(max_new_tokens=64), sampling=SamplingSpec())


async def leg(redis: Redis, replicas: int, jobs: int) -> list[float]:
    """Seconds per submit of `jobs` submits with submit_replicas=`replicas`."""
    settings = Settings(redis_url="redis://unused", submit_replicas=replicas,
                        max_concurrent_requests=jobs + 1, max_concurrent_requests_per_tenant=jobs + 1)
    store = JobStore(redis, Keys(f"bench{uuid.uuid4().hex[:6]}"), settings)
    await store.ensure_group()
    seconds = []
    for _ in range(jobs):
        started = time.perf_counter()
        await store.submit(spec())
        seconds.append(time.perf_counter() - started)
    await redis.flushdb()
    return seconds


def quantile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


async def main(pairs: int, jobs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        primary = EmbeddedRedis(Path(tmp) / "primary").start()
        replica = EmbeddedRedis(Path(tmp) / "replica",
                                extra_args=("--replicaof", "127.0.0.1", str(primary.port))).start()
        redis = Redis.from_url(primary.url, decode_responses=True)
        follower = Redis.from_url(replica.url, decode_responses=True)
        try:
            while (await follower.info("replication")).get("master_link_status") != "up":
                await asyncio.sleep(0.05)  # synced: WAIT counts it from now on
            print("| pair | A (0) median | A p99 | B (1) median | B p99 | B/A median |")
            print("|---|---|---|---|---|---|")
            ratios = []
            for pair in range(1, pairs + 1):
                a, b = await leg(redis, 0, jobs), await leg(redis, 1, jobs)
                ratio = statistics.median(b) / statistics.median(a)
                ratios.append(ratio)
                cells = [f"{value * 1e3:.3f} ms" for value in (statistics.median(a), quantile(a, 0.99),
                                                               statistics.median(b), quantile(b, 0.99))]
                print(f"| {pair} | {' | '.join(cells)} | {ratio:.2f} |")
            print(f"median B/A {statistics.median(ratios):.2f} (range {min(ratios):.2f}–{max(ratios):.2f}) "
                  f"over {pairs} pairs of {jobs} submits")
        finally:
            await redis.aclose()
            await follower.aclose()
            replica.stop()
            primary.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="A B pairs (A: no WAIT, B: WAIT 1)")
    parser.add_argument("--jobs", type=int, default=300, help="submits per leg")
    args = parser.parse_args()
    asyncio.run(main(args.pairs, args.jobs))
