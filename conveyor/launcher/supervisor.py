"""`conveyor serve`'s children, kept running: a child that dies is restarted with backoff while the
others keep serving, as a process manager would (systemd's `Restart=on-failure`, Kubernetes'
CrashLoopBackOff).

A worker killed mid-job is the fleet's ordinary failure: its jobs are reclaimed by the other
workers once its lease lapses and resumed from their events, and its replacement joins the fleet.
Stopping everything because one child died would turn that into an outage. A child that keeps
crashing is a different thing — a bad setting, a missing compiler, a broken model — and restarting
it forever would hide the cause: `CRASH_LIMIT` exits within `CRASH_WINDOW_S` stop the service with
the child's exit code named in the log.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("conveyor")

CRASH_LIMIT = 5  # exits of one child within CRASH_WINDOW_S: a crash loop, stop the service
CRASH_WINDOW_S = 300.0
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # before the 1st, 2nd, ... restart within the window

Spawn = Callable[[list[str], dict[str, str]], "subprocess.Popen[bytes]"]


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    exits: deque[float] = field(default_factory=deque)  # when it exited, within the crash window
    restart_at: float | None = None  # set while it waits out its backoff

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Supervisor:
    """Starts the children, restarts the ones that die (`poll`, called in the serve loop), stops
    them all. `spawn` and `clock` are injectable so the policy is tested without processes."""

    def __init__(self, env: dict[str, str], spawn: Spawn,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.env = env
        self._spawn = spawn
        self._clock = clock
        self.children: dict[str, Child] = {}
        self.stopping = False

    def start(self, name: str, argv: list[str], **env: str) -> None:
        child = Child(name, argv, {**self.env, **env})
        self.children[name] = child
        self._run(child)

    def _run(self, child: Child) -> None:
        log.info("starting %s", child.name)
        child.process = self._spawn(child.argv, child.env)
        child.restart_at = None

    def poll(self) -> str | None:
        """Restart what died (after its backoff); the reason to stop the service if a child is in a
        crash loop, else None."""
        now = self._clock()
        for child in self.children.values():
            if child.restart_at is not None:
                if now >= child.restart_at and not self.stopping:
                    self._run(child)
                continue
            if child.process is None or child.process.poll() is None:
                continue
            code = child.process.returncode
            child.exits.append(now)
            while child.exits and now - child.exits[0] > CRASH_WINDOW_S:
                child.exits.popleft()
            if len(child.exits) >= CRASH_LIMIT:
                return (f"{child.name} exited {len(child.exits)} times within {CRASH_WINDOW_S:.0f} s "
                        f"(last with {describe(code)}): see its log lines above for the cause")
            delay = BACKOFF_S[min(len(child.exits), len(BACKOFF_S)) - 1]
            log.error("%s exited with %s: restarting it in %.0f s (the other processes keep serving)",
                      child.name, describe(code), delay)
            child.restart_at = now + delay
        return None

    def kill_all(self) -> None:
        for child in self.children.values():
            if child.alive():
                child.process.kill()  # type: ignore[union-attr]

    def stop(self, timeout: float) -> None:
        """SIGTERM every running child (workers drain), SIGKILL whoever outlives `timeout`."""
        self.stopping = True
        running = [child for child in self.children.values() if child.alive()]
        for child in running:
            child.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = self._clock() + timeout
        for child in running:
            try:
                child.process.wait(max(0.1, deadline - self._clock()))  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time: killing it", child.name)
                child.process.kill()  # type: ignore[union-attr]
                child.process.wait()  # type: ignore[union-attr]


def describe(returncode: int) -> str:
    """`code 1`, or `SIGKILL` for a child a signal ended (Popen reports it as -signum)."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"code {returncode}"
