"""Waiting for a process the tests started: until the event that says it is ready (a heartbeat key,
an HTTP route answering), failing at once, with its log, when a process it depends on has exited.

The bound is for a hang, not for the machine's speed: a cold start compiles the engine's C++
kernels (one to two minutes each on a loaded 2-core machine, one after the other) before a worker
writes its first heartbeat, and a machine running two suites at once is slower still. It stays
just under pytest's per-test timeout (600 s, pyproject.toml), so a start that never ends fails with
the processes' logs rather than a bare stack dump.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import httpx

READY_TIMEOUT_S = 540.0
POLL_S = 0.25
# What a process prints when a port picked free was taken before it bound it (uvicorn, our /metrics,
# valkey): the caller may start it again on another port.
BIND_CONFLICT = re.compile(r"address already in use|cannot serve /metrics", re.IGNORECASE)

T = TypeVar("T")
Processes = Mapping[str, "subprocess.Popen[bytes]"]
# Called with the name of a process that exited; True when it started it again (a port conflict).
Respawn = Callable[[str], bool]
# The access-log lines of our own polls: in a log's tail they would hide what the process is doing.
_POLL_LINE = re.compile(r'^.*"GET /(ready|health|metrics) HTTP/1\.1" \d+\n?', re.MULTILINE)


def without_polls(log: str) -> str:
    """`log` without the access-log lines of the readiness polls."""
    return _POLL_LINE.sub("", log)


class NotReady(RuntimeError):
    """A process exited before the awaited event, or the event did not come within the bound."""


def answers(url: str) -> bool:
    """GET `url` answers 200 (refused, timed out or any other status: not yet)."""
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def check_alive(processes: Processes, what: str, logs: Callable[[], str],
                respawn: Respawn | None = None) -> None:
    """Raises NotReady naming the first process of `processes` that has exited (unless `respawn`
    started it again), with `logs()`."""
    for name, proc in list(processes.items()):
        if proc.poll() is not None and not (respawn and respawn(name)):
            raise NotReady(f"{name} exited with {proc.returncode} while waiting for {what}:\n{logs()}")


def wait_until(event: Callable[[], T], what: str, processes: Processes, logs: Callable[[], str],
               timeout: float = READY_TIMEOUT_S, respawn: Respawn | None = None) -> T:
    """event()'s first truthy value, polled while every process of `processes` runs."""
    deadline = time.monotonic() + timeout
    while not (value := event()):
        check_alive(processes, what, logs, respawn)
        if time.monotonic() > deadline:
            raise NotReady(f"not within {timeout:.0f} s: {what} (the processes still run):\n{logs()}")
        time.sleep(POLL_S)
    return value


async def await_until(event: Callable[[], Awaitable[T]], what: str, processes: Processes,
                      logs: Callable[[], str], timeout: float = READY_TIMEOUT_S) -> T:
    """wait_until for an event read with an asyncio client."""
    deadline = time.monotonic() + timeout
    while not (value := await event()):
        check_alive(processes, what, logs)
        if time.monotonic() > deadline:
            raise NotReady(f"not within {timeout:.0f} s: {what} (the processes still run):\n{logs()}")
        await asyncio.sleep(POLL_S)
    return value
