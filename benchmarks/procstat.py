"""CPU seconds per process of a running service, read from /proc (Linux), so a benchmark can say
where the cores went: `conveyor serve`'s api, worker(s), webhooks, valkey and the launcher, and
inside a worker its main thread (the asyncio loop: intake, publishing, Redis) apart from its other
threads (the engine thread and torch's OpenMP pool).

    before = snapshot(serve_pid); ...; usage = delta(before, snapshot(serve_pid))
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def parse_stat(text: str) -> tuple[int, float]:
    """(parent pid, user + system CPU seconds) from a /proc/PID/stat line. The command name in
    parentheses may itself hold spaces and parentheses, so fields are counted after the last ')'."""
    fields = text[text.rindex(")") + 2:].split()
    # after the name: state(3) ppid(4) ... utime(14) stime(15), numbered as in proc(5)
    return int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S


def role(argv: list[str]) -> str:
    """What a process of the service is, from its command line."""
    exe = Path(argv[0]).name if argv else "?"
    if "valkey" in exe or "redis-server" in exe:
        return "valkey"
    # `python -m conveyor.launcher.cli ROLE`, `conveyor ROLE`, or `python .../bin/conveyor ROLE`
    marks = [i for i, a in enumerate(argv[:3]) if a == "conveyor.launcher.cli" or Path(a).name == "conveyor"]
    if marks:
        sub = next((a for a in argv[marks[0] + 1:] if not a.startswith("-")), "serve")
        return "launcher" if sub == "serve" else sub
    return exe


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # it exited between listing and reading
        return None


def descendants(root: int) -> list[int]:
    """root and every process below it."""
    parents: dict[int, int] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (text := _read(entry / "stat")) is not None:
            parents[int(entry.name)] = parse_stat(text)[0]
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier]
        found += frontier
    return found


@dataclass(frozen=True)
class Usage:
    """CPU seconds by role (processes of one role summed); `worker main thread` split out of
    `worker` (which stays the whole process)."""

    seconds: dict[str, float]

    def total(self) -> float:
        return sum(v for k, v in self.seconds.items() if k != "worker main thread")


def snapshot(root: int) -> Usage:
    seconds: dict[str, float] = {}
    for pid in descendants(root):
        stat, cmdline = _read(PROC / str(pid) / "stat"), _read(PROC / str(pid) / "cmdline")
        if stat is None or cmdline is None:
            continue
        name = role([a for a in cmdline.split("\0") if a])
        seconds[name] = seconds.get(name, 0.0) + parse_stat(stat)[1]
        if name == "worker" and (main := _read(PROC / str(pid) / "task" / str(pid) / "stat")):
            seconds["worker main thread"] = seconds.get("worker main thread", 0.0) + parse_stat(main)[1]
    return Usage(seconds)


def delta(before: Usage, after: Usage) -> Usage:
    return Usage({k: v - before.seconds.get(k, 0.0) for k, v in after.seconds.items()})
