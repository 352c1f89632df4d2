"""Build the engine on a short-lived thread when another thread will step it (the worker's engine thread).

torch's CPU ops run on OpenMP. libgomp gives each thread that starts a parallel region its own team
of pool threads, kept until that thread exits, and once the process holds more such threads than it
has CPUs it stops spinning between parallel regions and parks its threads on a futex instead. Loading
the model on the main thread leaves a team there; the engine thread then makes a second one, and every
small op of every step pays a futex wake-up (docs/engine.md, "The engine is built off the main
thread", has the figures). Building the engine on
a thread that then exits frees its team, so the engine thread's team is the process's only one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def build_off_main(factory: Callable[[], T], name: str = "engine-load") -> T:
    """`factory()` run on a new thread that exits before this returns; its exception is re-raised here."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(factory())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as is
            error.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
