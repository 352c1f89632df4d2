"""What the whole serving path costs per generated token, with simulated engines (no GPU).

    python -m benchmarks.sim_fleet                                  # 1 and 2 workers, 64 streams × 128 tokens
    python -m benchmarks.sim_fleet --workers 1,2,4 --clients 128 --tokens 256 --step-ms 20
    python -m benchmarks.sim_fleet --async-jobs                     # /v1/jobs polled: nobody listens
    python -m benchmarks.sim_fleet --dialect openai                 # streamed chat completions
    python -m benchmarks.sim_fleet --cluster 3                      # a 3-primary Redis Cluster, 3 shards

Per run, on a fresh valkey-server: the api and W workers with `--engine sim`
(docs/operations/simulated-engine.md) as real processes, and C streaming clients (TGI
`/generate_stream`, or OpenAI `/v1/chat/completions` with `--dialect openai`; greedy, exactly M
tokens: the sim never draws EOS) each running J jobs one after another. The Redis counters are read
before and after (benchmarks/redis_fleet.py: INFO commandstats, stats, cpu): commands, bytes in/out
and server CPU µs per generated token (and of it the time inside commands, commandstats' usec: the
rest is the server's network and event loop), the commands' mix (calls and µs per token), and the
tokens/s the fleet reached; the api's and the workers' main threads' CPU µs per token (/proc, as
benchmarks/procstat.py reads it); and the transport's added latency, from the worker's stamp when
the engine emitted a token to the api's relay receiving it (the api's conveyor_relay_lag_seconds
histogram: p50 and p99 as the bucket bound they fall in). Unlike redis_cost, the api's relay and the
SSE clients are on the path; `--async-jobs` submits to /v1/jobs and polls instead (nobody listens).
`--cluster N`: an N-primary Redis Cluster on loopback instead of one node (the queue in N shards);
the counters are summed over the nodes. `--step-ms`: the sim's whole modelled step
(sim_step_fixed_ms, with weights and prefill at 0); the default 15 ms is an 8B model's decode step
at batch ~64 on an H200.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from redis.asyncio import Redis

from benchmarks.procstat import delta, snapshot
from benchmarks.redis_fleet import Counters, node_urls, read_counters
from conveyor.launcher.redis_cluster import LocalCluster
from conveyor.launcher.redis_server import EmbeddedRedis
from tests.conftest import start_service, stop_service


@dataclass
class SimRun:
    workers: int
    tokens: int
    seconds: float
    cost: Counters
    api_cpu_s: float
    worker_main_cpu_s: float
    lag_p50: float | None
    lag_p99: float | None


def lag_quantiles(metrics: str, *qs: float) -> list[float | None]:
    """The bucket bound (seconds) each quantile of conveyor_relay_lag_seconds falls in."""
    buckets: list[tuple[float, float]] = []
    for line in metrics.splitlines():
        if line.startswith("conveyor_relay_lag_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1] if buckets else 0.0
    return [next((le for le, n in buckets if n >= q * total), None) if total else None for q in qs]


async def _poller(base_url: str, jobs: int, tokens: int, offset: int) -> int:
    got = 0
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as http:
        for j in range(jobs):
            body = {"inputs": f"job {offset}-{j}: plan the fleet", "parameters": {"max_new_tokens": tokens}}
            job = (await http.post("/v1/jobs", json=body)).raise_for_status().json()
            while job["status"] not in ("succeeded", "failed", "cancelled", "expired"):
                await asyncio.sleep(0.25)
                job = (await http.get(f"/v1/jobs/{job['id']}")).raise_for_status().json()
            got += job["result"]["usage"]["completion_tokens"]
    return got


def _stream_request(dialect: str, prompt: str, tokens: int) -> tuple[str, dict[str, object]]:
    if dialect == "openai":
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                        "max_tokens": tokens, "stream": True}
    return "/generate_stream", {"inputs": prompt, "parameters": {"max_new_tokens": tokens}}


async def _client(base_url: str, jobs: int, tokens: int, offset: int, dialect: str) -> int:
    got = 0  # events with a token: TGI's StreamResponses, OpenAI's chunks (not `[DONE]`)
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as http:
        for j in range(jobs):
            path, body = _stream_request(dialect, f"job {offset}-{j}: plan the fleet", tokens)
            async with http.stream("POST", path, json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    got += line.startswith("data:") and line != "data: [DONE]"
    return got


async def _load(base_url: str, redis_url: str, args: argparse.Namespace) -> tuple[int, float, Counters]:
    nodes = [Redis.from_url(url) for url in node_urls(redis_url)]
    try:
        before = await read_counters(nodes)
        started = time.perf_counter()
        clients = (_poller(base_url, args.jobs, args.tokens, c) if args.async_jobs
                   else _client(base_url, args.jobs, args.tokens, c, args.dialect)
                   for c in range(args.clients))
        counts = await asyncio.gather(*clients)
        seconds = time.perf_counter() - started
        await asyncio.sleep(0.5)  # the workers' last acknowledgements
        after = await read_counters(nodes)
    finally:
        for node in nodes:
            await node.aclose()
    # The first read's 3 INFO calls a node are counted by the second.
    return sum(counts), seconds, (after - before).without({"info": 3 * len(nodes)})


def one_run(args: argparse.Namespace, workers: int, model: Path, tmp: Path) -> SimRun:
    server: EmbeddedRedis | LocalCluster
    if args.cluster:
        server = LocalCluster(tmp / f"cluster-{workers}", nodes=args.cluster).start()
    else:
        server = EmbeddedRedis(tmp / f"redis-{workers}").start()
    env = {"CONVEYOR_MODEL": str(model), "CONVEYOR_ENGINE": "sim", "CONVEYOR_LOG_LEVEL": "warning",
           "CONVEYOR_SIM_STEP_FIXED_MS": str(args.step_ms), "CONVEYOR_SIM_WEIGHT_GB": "0",
           "CONVEYOR_SIM_PREFILL_GFLOP_PER_TOKEN": "0", "CONVEYOR_MAX_CONCURRENT_REQUESTS": "1024",
           "CONVEYOR_KV_CACHE_MEMORY": "8GiB", "CONVEYOR_GENERATE_PROMPT_FORMAT": "raw"}
    if args.cluster:
        env |= {"CONVEYOR_REDIS_CLUSTER": "true", "CONVEYOR_JOBS_SHARDS": str(args.cluster)}
    (tmp / str(workers)).mkdir()
    service = start_service(tmp / str(workers), server.url, env, workers=workers)
    try:
        api = service.processes["api"].pid
        workers_pids = [p.pid for name, p in service.processes.items() if name.startswith("worker")]
        before = [snapshot(api), *(snapshot(pid) for pid in workers_pids)]
        tokens, seconds, cost = asyncio.run(_load(service.base_url, server.url, args))
        after = [snapshot(api), *(snapshot(pid) for pid in workers_pids)]
        used = [delta(b, a) for b, a in zip(before, after, strict=True)]
        p50, p99 = lag_quantiles(httpx.get(service.base_url + "/metrics", timeout=30).text, 0.5, 0.99)
    finally:
        stop_service(service)
        server.stop()
    return SimRun(workers, tokens, seconds, cost, used[0].total(),
                  sum(u.seconds.get("worker main thread", 0.0) for u in used[1:]), p50, p99)


def print_runs(runs: list[SimRun], args: argparse.Namespace) -> None:
    kind = "polling (async jobs)" if args.async_jobs else f"streaming ({args.dialect})"
    redis = f"a {args.cluster}-primary cluster (counters summed)" if args.cluster else "one Redis node"
    print(f"\n{args.clients} {kind} clients × {args.jobs} jobs × {args.tokens} tokens, "
          f"simulated step {args.step_ms} ms, {redis}")
    print("\n| workers | tokens | s | tokens/s | cmds/token | bytes in/token | bytes out/token "
          "| server CPU µs/token | in commands µs/token | api CPU µs/token | worker main thread CPU µs/token "
          "| added latency p50 / p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        c, t = run.cost, run.tokens
        lag = " / ".join("-" if v is None else f"≤ {v * 1000:g} ms" for v in (run.lag_p50, run.lag_p99))
        print(f"| {run.workers} | {t} | {run.seconds:.1f} | {t / run.seconds:.0f} | {c.commands / t:.2f} "
              f"| {c.bytes_in / t:.0f} | {c.bytes_out / t:.0f} | {c.cpu_s / t * 1e6:.1f} "
              f"| {sum(c.usec.values()) / t:.1f} "
              f"| {run.api_cpu_s / t * 1e6:.1f} | {run.worker_main_cpu_s / t * 1e6:.1f} | {lag} |")
    for run in runs:
        top = sorted(run.cost.calls.items(), key=lambda kv: -kv[1])[:10]
        mix = ", ".join(f"{k} {v / run.tokens:.3f} ({run.cost.usec.get(k, 0) / run.tokens:.2f} µs)"
                        for k, v in top)
        print(f"\ncommands per token, {run.workers} worker(s): {mix}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2", help="worker counts to run, comma-separated")
    parser.add_argument("--clients", type=int, default=64, help="concurrent streaming clients")
    parser.add_argument("--jobs", type=int, default=2, help="jobs per client, one after another")
    parser.add_argument("--tokens", type=int, default=128, help="generated tokens per job")
    parser.add_argument("--step-ms", type=float, default=15.0, help="the simulated step time, ms")
    parser.add_argument("--async-jobs", action="store_true", help="submit to /v1/jobs and poll: no listener")
    parser.add_argument("--dialect", choices=("tgi", "openai"), default="tgi",
                        help="the streaming clients' API: TGI /generate_stream, OpenAI /v1/chat/completions")
    parser.add_argument("--cluster", type=int, default=0, metavar="N",
                        help="an N-primary Redis Cluster (the queue in N shards) instead of one node")
    args = parser.parse_args()
    from conveyor.engine.loader import resolve_model

    model = resolve_model(None).path  # its tokenizer and config.json only
    with tempfile.TemporaryDirectory() as tmp_dir:
        runs = [one_run(args, int(w), model, Path(tmp_dir)) for w in args.workers.split(",")]
    print_runs(runs, args)
    expected = args.clients * args.jobs * args.tokens
    bad = [run.workers for run in runs if run.tokens != expected]
    if bad:
        print(f"\nruns with other than {expected} tokens streamed: workers {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
