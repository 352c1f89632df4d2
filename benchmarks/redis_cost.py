"""What the job path costs Redis, per generated token and per job, and where one node saturates.

    python -m benchmarks.redis_cost                     # 48 jobs × 64 tokens, 1, 2, 3 workers
    python -m benchmarks.redis_cost --jobs 96 --tokens 128 --workers 1,2,3 --load-seconds 15
    python -m benchmarks.redis_cost --redis-url redis://host:6379/0   # an existing Redis
    python -m benchmarks.redis_cost --cluster --jobs-shards 3   # a fresh 3-node cluster per run

(1) A fixed workload (the tiny random Llama of the tests, so the engine is never the bottleneck;
    N jobs × M tokens, greedy, EOS ignored) through 1, 2 and 3 worker processes, each run on a
    fresh valkey-server (benchmarks/redis_fleet.py): Redis commands (as Redis counts them: a script's
    own commands included), round trips, bytes in/out, per generated token and per job, and how
    the jobs spread over the workers (none lost, each job's event indices exactly 0..M-1).
(2) The single-node op rate of the same command mix with redis-py pipelines (benchmarks/redis_load.py).
(3) The capacity table: generated tokens/s at which one node saturates = the node's commands per
    CPU second / commands per token; an N-shard cluster scaled by N, an upper bound.

--redis-url: runs on that Redis (its other clients' traffic is counted too); otherwise a fresh
valkey-server per run. --cluster: Redis Cluster mode: a fresh 3-node cluster on loopback per run
(launcher/redis_cluster.LocalCluster; or --redis-url listing a cluster's nodes), the workers run with
CONVEYOR_REDIS_CLUSTER=true, the counters are summed over the nodes, and the op-rate load runs on a
cluster too (its commands per server CPU second: per node CPU, comparable with a single node's).
--jobs-shards: the queue's shards (CONVEYOR_JOBS_SHARDS), e.g. one per node on a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from benchmarks.redis_fleet import Run, run_workload
from benchmarks.redis_load import Load, measure
from conveyor.launcher.redis_cluster import LocalCluster
from conveyor.launcher.redis_server import EmbeddedRedis

SHARDS = (1, 3, 6, 12)


def tiny_model(where: Path) -> Path:
    from conveyor.engine.loader import resolve_model
    from tests.conftest import write_tiny_llama

    return write_tiny_llama(where / "tiny-llama", resolve_model(None).path)


def fresh_server(args: argparse.Namespace, where: Path) -> EmbeddedRedis | LocalCluster:
    """A fresh valkey-server, or with --cluster a fresh 3-node cluster on loopback."""
    return LocalCluster(where).start() if args.cluster else EmbeddedRedis(where).start()


def one_run(args: argparse.Namespace, workers: int, model: Path, tmp: Path) -> Run:
    env = {"CONVEYOR_MAX_BATCH_SIZE": str(args.max_batch_size)}

    def run(url: str) -> Run:
        return asyncio.run(run_workload(url, model, tmp, workers, args.jobs, args.tokens, args.prompt,
                                        env, cluster=args.cluster, jobs_shards=args.jobs_shards))

    if args.redis_url:
        return run(args.redis_url)
    server = fresh_server(args, tmp / f"redis-{workers}")
    try:
        return run(server.url)
    finally:
        server.stop()


def print_runs(runs: list[Run]) -> None:
    print(
        "\n| workers | jobs × tokens | s | tokens/s | cmds/token | round trips/token | bytes in/token "
        "| bytes out/token | cmds/job | round trips/job | server CPU µs/token | jobs per worker "
        "| lost | bad |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        c, t, j = run.cost, run.tokens, run.jobs
        spread = [list(run.owners.values()).count(f"w{i}") for i in range(run.workers)]
        print(
            f"| {run.workers} | {j} × {t // j} | {run.seconds:.2f} | {t / run.seconds:.0f} "
            f"| {c.commands / t:.2f} | {c.round_trips / t:.3f} | {c.bytes_in / t:.0f} "
            f"| {c.bytes_out / t:.1f} | {c.commands / j:.1f} "
            f"| {c.round_trips / j:.1f} | {c.cpu_s / t * 1e6:.1f} | {spread} | {len(run.lost)} "
            f"| {len(run.bad_events)} |"
        )
    last = runs[-1].cost
    mix = ", ".join(
        f"{k} {v / runs[-1].tokens:.3f}" for k, v in sorted(last.calls.items(), key=lambda kv: -kv[1])
    )
    print(f"\ncommands per token ({runs[-1].workers} workers): {mix}")
    for run in runs:
        idle = run.idle
        print(
            f"idle, {run.workers} worker(s): {idle.commands / 2:.1f} commands/s, {idle.round_trips / 2:.1f} "
            "round trips/s (heartbeats, blocked reads)"
        )


def print_capacity(runs: list[Run], load: Load) -> None:
    per_token = max(run.cost.commands / run.tokens for run in runs)
    node = load.commands_per_cpu_s / per_token
    print(
        f"\nop rate, one node ({load.batch} jobs per pipeline): "
        f"{load.commands / load.seconds:,.0f} commands/s measured at "
        f"{load.utilization:.0%} of a server core ({load.tokens / load.seconds:,.0f} tokens/s); "
        f"{load.commands_per_cpu_s:,.0f} commands per server CPU second"
    )
    # The workload's own server CPU per token: measured at a low rate, so the server's fixed costs
    # per second (timers, AOF flushes, idle workers) weigh on it: the conservative figure.
    cpu = max(run.cost.cpu_s / run.tokens for run in runs)
    print(f"\n| Redis | generated tokens/s at saturation: op rate / {per_token:.2f} commands per token "
          f"| conservative: 1 / the workload's {cpu * 1e6:.1f} µs of server CPU per token |")
    print("|---|---|---|")
    for shards in SHARDS:
        label = "1 node" if shards == 1 else f"{shards}-shard cluster (N × 1 node, upper bound)"
        print(f"| {label} | {node * shards:,.0f} | {shards / cpu:,.0f} |")

def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=64, help="generated tokens per job")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens per job")
    parser.add_argument("--workers", default="1,2,3", help="worker counts to run, comma-separated")
    parser.add_argument(
        "--redis-url", default=None, help="an existing Redis (default: a fresh valkey-server)"
    )
    parser.add_argument("--cluster", action="store_true",
                        help="Redis Cluster mode: a fresh 3-node cluster per run (or --redis-url's)")
    parser.add_argument("--jobs-shards", type=int, default=1, help="shards of the jobs queue")
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=8,
        help="running jobs per worker: a worker reads as many jobs as it has room for, so a "
        "small batch spreads a burst over the workers",
    )
    parser.add_argument("--load-seconds", type=float, default=10.0, help="length of the op-rate load")
    parser.add_argument("--load-clients", type=int, default=3, help="client processes of the op-rate load")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = tiny_model(tmp)
        runs = [one_run(args, int(w), model, tmp) for w in args.workers.split(",")]
        print_runs(runs)
        # The load pipelines as deep as the workload did (tokens per round trip, its shallowest run).
        batch = max(1, round(min(run.tokens / run.cost.round_trips for run in runs)))
        if args.redis_url:
            load = measure(
                args.redis_url, args.load_seconds, args.load_clients, batch, args.tokens, args.prompt
            )
        else:
            server = fresh_server(args, tmp / "redis-load")
            try:
                load = measure(
                    server.url, args.load_seconds, args.load_clients, batch, args.tokens, args.prompt
                )
            finally:
                server.stop()
        print_capacity(runs, load)
        for run in runs:
            if run.lost or run.bad_events:  # the workers' logs say why
                print(f"\n{run.workers} worker(s): lost {run.lost}, bad indices {run.bad_events}")
                for log in sorted(tmp.glob("*.log")):
                    print(f"--- {log.name}\n{log.read_text()[-2000:]}")
    return 1 if any(run.lost or run.bad_events for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
