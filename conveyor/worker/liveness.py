"""The worker's liveness (`/health` on its metrics port): 200 while its loops make progress.

The metrics server is a thread of its own, so `/metrics` still answers when the engine's step loop
or the asyncio loop is hung; a probe on it never restarts a stuck worker. Each loop stamps a
monotonic time on every iteration, idle ones included (the engine thread wakes every
`IDLE_TICK` s with nothing to do), so an idle worker is healthy and only a loop stuck for longer
than `worker_stall_timeout` fails the probe. A loop that is not meant to run (not started yet, or
stopped to drain) reports no time and counts as live: the drain has its own deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

IDLE_TICK = 1.0  # seconds between the idle iterations of the engine thread and the asyncio ticker

Clock = Callable[[], float]
Source = Callable[[], float | None]  # the monotonic time of a loop's last iteration; None: not running


class Liveness:
    def __init__(self, stall_timeout: float, clock: Clock = time.monotonic) -> None:
        self.stall_timeout = stall_timeout
        self.clock = clock
        self._sources: dict[str, Source] = {}

    def watch(self, name: str, source: Source) -> None:
        self._sources[name] = source

    def stale(self) -> dict[str, float]:
        """The loops that made no progress within the bound, with their seconds since the last one."""
        now = self.clock()
        ages = {name: now - at for name, source in self._sources.items() if (at := source()) is not None}
        return {name: age for name, age in ages.items() if age > self.stall_timeout}

    def report(self) -> tuple[int, str]:
        """The `/health` answer: (HTTP status, body)."""
        stale = self.stale()
        if not stale:
            return 200, "ok: " + (", ".join(sorted(self._sources)) or "no loop") + " live\n"
        named = ", ".join(f"{name} loop made no progress for {age:.0f} s"
                          for name, age in sorted(stale.items()))
        return 503, f"stalled: {named} (bound: worker_stall_timeout = {self.stall_timeout:g} s)\n"


class Ticker:
    """Stamps the asyncio loop's progress: a task that wakes every IDLE_TICK s. A blocked loop (a
    synchronous call that never returns, a busy callback) stops it."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.at: float | None = None

    async def run(self) -> None:
        try:
            while True:
                self.at = self.clock()
                await asyncio.sleep(IDLE_TICK)
        finally:  # stopped with the worker: its shutdown is bounded by the drain, not by this probe
            self.at = None
