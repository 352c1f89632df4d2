"""What an idle fleet costs Redis: commands per second with 1, 2, 4, 8 ready workers and no job.

    python -m benchmarks.idle_cost                        # 1, 2, 4, 8 workers, a 12 s window each
    python -m benchmarks.idle_cost --workers 1,2 --window 20
    python -m benchmarks.idle_cost --redis-url redis://host:6379/0   # an existing Redis

Real `conveyor worker` processes (the tiny random Llama of the tests, affinity on, so each is an
affinity owner with its own stream, default heartbeat and lease) are started on a fresh
valkey-server per fleet size (or on --redis-url: its other clients' traffic is counted too), then,
once every heartbeat is there and one more heartbeat has passed, the server's `INFO commandstats`
is read before and after a window with nothing queued: commands as Redis counts them (a script's
own commands included), by name, per second and per worker. The window should span at least two
heartbeats (5 s by default), so the once-a-heartbeat commands (heartbeat, liveness, reclaim sweep)
weigh what they weigh. The bench's own INFO calls are taken out.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from redis.asyncio import Redis

from benchmarks.redis_cost import tiny_model
from benchmarks.redis_fleet import REPO, Counters, _wait_heartbeats, read_counters, stop_workers, worker_env
from conveyor.jobqueue.keys import Keys
from conveyor.launcher.redis_server import EmbeddedRedis


async def idle_fleet(url: str, model: Path, log_dir: Path, workers: int, window: float,
                     settle: float) -> Counters:
    """The server's counters over `window` seconds with `workers` idle workers."""
    prefix = f"idle{uuid.uuid4().hex[:8]}"
    procs: list[subprocess.Popen[bytes]] = []
    async with Redis.from_url(url, decode_responses=True) as redis:
        try:
            for i in range(workers):
                log = open(log_dir / f"{prefix}-w{i}.log", "ab")  # noqa: SIM115 - closed with the process
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "conveyor", "worker", "--worker-id", f"w{i}"],
                    env=worker_env(url, prefix, model, {}), cwd=REPO, stdout=log, stderr=log))
            await _wait_heartbeats(redis, Keys(prefix), procs, log_dir, 600)
            await asyncio.sleep(settle)  # every worker past its start-up and first heartbeats
            before = await read_counters([redis])
            await asyncio.sleep(window)
            return (await read_counters([redis]) - before).without({"info": 3})
        finally:
            stop_workers(procs)


def report(runs: dict[int, Counters], window: float) -> None:
    print("\n| idle workers | commands/s | commands/s per worker | round trips/s |")
    print("|---|---|---|---|")
    for n, c in runs.items():
        per_s = c.commands / window
        print(f"| {n} | {per_s:.1f} | {per_s / n:.1f} | {c.round_trips / window:.1f} |")
    names = sorted({k for c in runs.values() for k in c.calls},
                   key=lambda k: -max(c.calls.get(k, 0) for c in runs.values()))
    print("\nBy command, calls/s (a script's own commands counted under their names):\n")
    print("| command | " + " | ".join(f"{n} workers" for n in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{c.calls.get(name, 0) / window:.1f}" for c in runs.values())
              + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2,4,8", help="fleet sizes, comma-separated")
    parser.add_argument("--window", type=float, default=12.0, help="seconds counted per fleet size")
    parser.add_argument("--settle", type=float, default=6.0, help="seconds after the last worker is up")
    parser.add_argument("--redis-url", help="an existing Redis (default: a fresh valkey-server per size)")
    args = parser.parse_args(argv)
    runs: dict[int, Counters] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = tiny_model(tmp)
        for n in (int(w) for w in args.workers.split(",")):
            server = None if args.redis_url else EmbeddedRedis(tmp / f"redis-{n}").start()
            try:
                url = args.redis_url or server.url  # type: ignore[union-attr]
                runs[n] = asyncio.run(idle_fleet(url, model, tmp, n, args.window, args.settle))
            finally:
                if server is not None:
                    server.stop()
            print(f"{n} idle worker(s): {runs[n].commands / args.window:.1f} commands/s", file=sys.stderr)
    report(runs, args.window)


if __name__ == "__main__":
    main()
