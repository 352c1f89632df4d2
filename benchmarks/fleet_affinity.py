"""Prefix-affinity placement across a fleet (`benchmarks/fleet.py affinity`): does a job land where its
prefix is cached?

    nice -n 10 .venv/bin/python benchmarks/fleet.py affinity                  # 1, 2 and 3 workers, 200 requests
    nice -n 10 .venv/bin/python benchmarks/fleet.py affinity --requests 100 --fleets 2
    .venv/bin/python benchmarks/fleet.py affinity --model default --fleets 1 2     # SmolLM2 itself

Workloads (the same prompts for every sitting, from one seed):
  shared:  `--prefixes` (8) "system prompts" of `--prefix-tokens` (512) random tokens, each request one
           of them at random + 16 tokens of its own;
  unique:  every request its own 512 + 16 random tokens: no prefix to share (what affinity costs).
For each fleet size (`--fleets`, default 1 2 3) and workload, fresh worker processes (`conveyor
worker`, cold caches) with affinity on, then fresh ones with it off (one worker: on only, the
baseline), `--concurrency` closed-loop clients submitting as the api does (conveyor.api.jobpath.store.JobStore).
Reported per sitting: the fleet's prefix-cache hit rate (cached prompt tokens / prompt tokens, from
the jobs' usage), prompt tokens actually prefilled, requests/s, TTFT p50/p99 (record's first_token_at −
created_at) and the workers' placement outcomes (`conveyor_jobs_placed`). Each worker's KV cache holds
`--kv-blocks` blocks (default 192: about 5 of the 8 prompts), so a worker that sees every prompt
evicts, and one that sees only its share does not. Heartbeats every 250 ms (HEARTBEAT_MS), so
summaries are fresh. `--hidden`/`--layers` widen/deepen the random Llama, so prefill weighs more.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
from redis.asyncio import Redis

from benchmarks.fleet import REPO, finished, log, pct
from conveyor.api.jobpath.store import JobStore
from conveyor.jobqueue.keys import Keys
from conveyor.launcher.redis_server import free_port
from conveyor.settings import Settings
from conveyor.wire.job import JobResult, JobSpec, SamplingSpec, StoppingSpec

HEARTBEAT_MS = 250  # the tests' heartbeat: summaries (and the api's view of them) stay fresh
SUFFIX = 16
OUTCOMES = ("affinity_hit", "stolen", "shared")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fleets", type=int, nargs="+", default=[1, 2, 3], help="worker counts")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--prefixes", type=int, default=8)
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--kv-blocks", type=int, default=192, help="KV blocks (16 tokens) per worker")
    parser.add_argument("--affinity-wait-ms", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1, help="on/off pairs per fleet, interleaved")
    parser.add_argument("--workloads", nargs="+", default=["shared", "unique"], choices=["shared", "unique"])


def workload(kind: str, args: argparse.Namespace, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1000, 40_000) for _ in range(n)]

    systems = [tokens(args.prefix_tokens) for _ in range(args.prefixes)]
    if kind == "shared":
        return [systems[rng.randrange(args.prefixes)] + tokens(SUFFIX) for _ in range(args.requests)]
    return [tokens(args.prefix_tokens + SUFFIX) for _ in range(args.requests)]


@dataclass
class Row:
    workers: int
    affinity: bool
    kind: str
    hit_rate: float
    prefilled: int
    rps: float
    ttft_p50: float
    ttft_p99: float
    placed: dict[str, int]


def placed(ports: list[int]) -> dict[str, int]:
    out = dict.fromkeys(OUTCOMES, 0)
    for port in ports:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        for outcome in OUTCOMES:
            match = re.search(rf'conveyor_jobs_placed_total{{outcome="{outcome}"}} ([0-9.e+]+)', text)
            out[outcome] += int(float(match.group(1))) if match else 0
    return out


async def sitting(args: argparse.Namespace, url: str, model: Path, workers: int, affinity: bool, kind: str,
                  prompts: list[list[int]]) -> Row:
    prefix = f"aff{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix)
    ports = [free_port() for _ in range(workers)]
    kv_bytes = args.kv_blocks * args.block_bytes
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")},
           "REDIS_URL": url, "CONVEYOR_MODEL": str(model), "CONVEYOR_KEY_PREFIX": prefix,
           "CONVEYOR_KV_CACHE_MEMORY": str(kv_bytes), "CONVEYOR_AFFINITY": str(affinity).lower(),
           "CONVEYOR_AFFINITY_WAIT_MS": str(args.affinity_wait_ms),
           "CONVEYOR_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", "conveyor", "worker", "--worker-id", f"w{i}"],
                              env={**env, "CONVEYOR_WORKER_METRICS_PORT": str(ports[i])}, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for i in range(workers)]
    redis = Redis.from_url(url, decode_responses=True)
    try:
        deadline = time.monotonic() + 300
        for i in range(workers):
            while not await redis.exists(keys.worker(f"w{i}")):
                if time.monotonic() > deadline or procs[i].poll() is not None:
                    raise RuntimeError(f"worker w{i} did not come up")
                await asyncio.sleep(0.1)
        settings = Settings(redis_url=url, key_prefix=prefix, max_concurrent_requests=100_000,
                            affinity=affinity, affinity_wait_ms=args.affinity_wait_ms,
                            heartbeat_interval_ms=HEARTBEAT_MS)
        store = JobStore(redis, keys, settings)
        todo = iter(prompts)
        results: list[tuple[JobResult, float]] = []

        async def client() -> None:
            for prompt in todo:
                job = JobSpec(id=uuid.uuid4().hex, created_at=time.time(), prompt_ids=prompt,
                              stopping=StoppingSpec(max_new_tokens=args.new_tokens, ignore_eos=True),
                              sampling=SamplingSpec())
                await store.submit(job)
                results.append(await finished(redis, keys, job.id))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.concurrency)))
        wall = time.perf_counter() - started
        outcomes = await asyncio.to_thread(placed, ports)
    finally:
        await redis.aclose()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)
    prompt_tokens = sum(r.usage.prompt_tokens for r, _ in results if r.usage)
    cached = sum(r.usage.cached_tokens for r, _ in results if r.usage)
    ttfts = [t for _, t in results]
    return Row(workers, affinity, kind, cached / prompt_tokens, prompt_tokens - cached, len(results) / wall,
               pct(ttfts, 0.5), pct(ttfts, 0.99), outcomes)


async def run_affinity(args: argparse.Namespace, url: str, model: Path) -> None:
    rows: list[Row] = []
    for kind in args.workloads:
        prompts = workload(kind, args)
        for workers in args.fleets:
            pairs = [True, False] * args.repeat if workers > 1 else [True]
            for affinity in pairs:  # on, off, on, off, …: a load change on the machine hits both
                rows.append(await sitting(args, url, model, workers, affinity, kind, prompts))
                r = rows[-1]
                log(f"{kind}, {workers} worker(s), affinity {'on' if affinity else 'off'}: "
                    f"hit {r.hit_rate:.1%}, {r.rps:.2f} req/s")
    print(f"\n{args.requests} requests, {args.concurrency} closed-loop clients, {args.new_tokens} new tokens "
          f"each; shared: {args.prefixes} prefixes of {args.prefix_tokens} tokens + {SUFFIX}; unique: "
          f"{args.prefix_tokens + SUFFIX} tokens each; {args.kv_blocks} KV blocks per worker\n")
    print("| workload | workers | affinity | hit rate | prefilled tokens | req/s | TTFT p50 | TTFT p99 "
          "| affinity_hit / stolen / shared |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = r.placed
        mode = "on" if r.affinity else "off"
        print(f"| {r.kind} | {r.workers} | {mode} | {r.hit_rate:.1%} | {r.prefilled} | {r.rps:.2f} "
              f"| {r.ttft_p50:.3f} s | {r.ttft_p99:.3f} s "
              f"| {p['affinity_hit']} / {p['stolen']} / {p['shared']} |")
    for kind in args.workloads:
        for workers in args.fleets:
            on = [r for r in rows if (r.kind, r.workers, r.affinity) == (kind, workers, True)]
            off = [r for r in rows if (r.kind, r.workers, r.affinity) == (kind, workers, False)]
            if on and off:
                ratios = sorted(a.rps / b.rps for a, b in zip(on, off, strict=True))
                gain = pct([r.hit_rate for r in on], 0.5) - pct([r.hit_rate for r in off], 0.5)
                print(f"{kind}, {workers} workers: affinity on/off throughput {pct(ratios, 0.5):.2f}x "
                      f"(range {ratios[0]:.2f}-{ratios[-1]:.2f} over {len(ratios)} pair(s)), hit rate "
                      f"{gain:+.1%} points")
