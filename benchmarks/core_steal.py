"""What a little CPU taken by another process costs the engine: `benchmarks/engine.py --workload peer
--skip-hf` alone, then beside a process that takes a core for --on-ms every --period-ms (as the
api, valkey and the client wake for a moment each step in the full stack), alternated.

    .venv/bin/python benchmarks/core_steal.py                       # 1 ms in 10: 10 % of one core
    .venv/bin/python benchmarks/core_steal.py --on-ms 5 --period-ms 50 --pairs 3
    .venv/bin/python benchmarks/core_steal.py --policies normal,nice,idle   # the other at nice 19 / SCHED_IDLE

If the engine lost only the CPU taken, a process using 10 % of one of the 2 cores would cost it 5 %
of its throughput. Its OpenMP team splits each GEMM statically between the threads, so while one
thread has lost its core the other finishes its share and waits for it at the barrier: the team
runs at the pace of its slowest thread, and the loss is the whole time taken, or more.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_TOTAL = re.compile(r"\(c\) conveyor engine.*?total\s+([0-9.,]+) tok/s")


POLICIES = ("normal", "nice", "idle")


def lower(policy: str) -> None:
    """This process's CPU priority: normal, nice 19, or SCHED_IDLE (runs only on a core nothing else
    wants)."""
    if policy == "nice":
        os.nice(19)
    elif policy == "idle":
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def steal(on_s: float, period_s: float) -> None:
    """Spin for on_s, sleep for the rest of period_s, forever (the child process's part)."""
    while True:
        start = time.perf_counter()
        while time.perf_counter() - start < on_s:
            pass
        time.sleep(max(0.0, period_s - on_s))


def engine_run() -> float:
    cmd = [sys.executable, str(REPO / "bench" / "engine.py"), "--workload", "peer", "--skip-hf"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
    match = _TOTAL.search(done.stdout)
    if match is None:
        raise SystemExit(f"benchmarks/engine.py printed no throughput:\n{done.stdout}\n{done.stderr}")
    return float(match.group(1).replace(",", ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--on-ms", type=float, default=1.0, help="the core taken this long... [default: 1]")
    p.add_argument("--period-ms", type=float, default=10.0, help="...every this long [default: 10]")
    p.add_argument("--pairs", type=int, default=2, help="alone / beside pairs [default: 2]")
    p.add_argument("--policies", default="normal",
                   help=f"the other process's priority, one run beside it per entry: {', '.join(POLICIES)} "
                        "(nice 19, SCHED_IDLE) [default: %(default)s]")
    p.add_argument("--steal", action="store_true", help=argparse.SUPPRESS)  # the child process
    p.add_argument("--policy", default="normal", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.on_ms <= 0 or args.period_ms < args.on_ms:
        raise SystemExit("core_steal.py: need 0 < --on-ms <= --period-ms")
    policies = args.policies.split(",")
    if any(x not in POLICIES for x in policies):
        raise SystemExit(f"core_steal.py: --policies takes {', '.join(POLICIES)}, comma-separated")
    if args.steal:
        lower(args.policy)
        steal(args.on_ms / 1000, args.period_ms / 1000)
    share = args.on_ms / args.period_ms
    print(f"the other process takes {100 * share:.0f} % of one core ({50 * share:.1f} % of 2); "
          "each run is benchmarks/engine.py --workload peer --skip-hf", flush=True)
    ratios: dict[str, list[float]] = {policy: [] for policy in policies}
    for pair in range(args.pairs):
        alone = engine_run()
        print(f"pair {pair + 1}: alone {alone:,.1f} total tok/s", flush=True)
        for policy in policies:
            beside, got = beside_thief(args, policy)
            ratios[policy].append(beside / alone)
            print(f"  beside it ({policy}) {beside:,.1f} ({beside / alone:.3f}x); it got {100 * got:.1f} % "
                  "of one core", flush=True)
    for policy, rs in ratios.items():
        print(f"{policy}: beside / alone per pair: {', '.join(f'{r:.3f}' for r in rs)}")
    print(f"a loss of only the CPU taken would read {1 - share / 2:.3f}")
    return 0


def beside_thief(args: argparse.Namespace, policy: str) -> tuple[float, float]:
    """The engine's throughput beside the other process, and the share of one core that one got."""
    thief = subprocess.Popen([sys.executable, __file__, "--steal", "--on-ms", str(args.on_ms),
                              "--period-ms", str(args.period_ms), "--policy", policy])
    start = time.perf_counter()
    try:
        beside = engine_run()
    finally:
        thief.kill()
        _, _, usage = os.wait4(thief.pid, 0)
    return beside, (usage.ru_utime + usage.ru_stime) / (time.perf_counter() - start)


if __name__ == "__main__":
    raise SystemExit(main())
