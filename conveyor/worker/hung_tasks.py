"""What a task that will not end is waiting on, for a log line or a test's failure message:
`Task.print_stack` shows only the task's own frame, not the coroutines it awaits, which is where a
hang is."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


def awaited_chain(task: asyncio.Task[Any]) -> str:
    """The task's name and state, then one line per awaiting frame, outermost first, then what the
    innermost one waits on."""
    state = "done" if task.done() else "cancelling" if task.cancelling() else "pending"
    lines = [f"task {task.get_name()} ({state}):"]
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:  # a Future, or a coroutine that has finished
            lines.append(f"  waits on {awaited!r}")
            break
        lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return "\n".join(lines)


async def cancel_all(tasks: tuple[asyncio.Task[Any], ...], grace_s: float,
                     owner: str) -> set[asyncio.Task[Any]]:
    """Cancels `tasks` and waits for them to end, but not forever: one that has not ended after
    `grace_s` (a client library's cleanup that hangs: seen once in CI, a worker's lease loop) is
    logged with what it waits on and left behind, so that what owns them still stops. Returns those."""
    for task in tasks:
        task.cancel()
    done, hung = await asyncio.wait(tasks, timeout=grace_s)
    for task in done:
        if not task.cancelled():
            task.exception()  # retrieved: a task's failure was handled where it ran, or by its owner
    for task in hung:
        log.error("%s: its task %s did not end %.0fs after it was cancelled; leaving it behind.\n%s",
                  owner, task.get_name(), grace_s, awaited_chain(task))
    return hung
