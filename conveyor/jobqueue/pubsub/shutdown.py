"""The relay's shutdown, bounded: an api that stops (a rolling update, SIGTERM) must not hang on a
Redis node that does not answer, and redis-py waits out a pub/sub teardown it has begun even when
the caller is cancelled (PubSub.aclose), so a cancel or asyncio.timeout alone cannot bound it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable

log = logging.getLogger("conveyor.api.jobpath.relay")

STOP_TIMEOUT_S = 5.0  # each step of the relay's shutdown waits this long, then goes on


async def finish_within(what: str, work: Iterable[Awaitable[object]],
                        timeout: float = STOP_TIMEOUT_S) -> None:
    """Waits up to `timeout` for each of `work` (cancelled tasks to end, closes to finish); what is not
    done by then is logged and left running. Their errors are logged, not raised: a shutdown goes on."""
    tasks = {asyncio.ensure_future(item) for item in work}
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in done:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("relay: %s failed at shutdown (%s: %s)", what, type(exc).__name__, exc)
    if pending:
        log.warning("relay: %s did not finish within %.0f s at shutdown; left behind (is a Redis node "
                    "unreachable? its socket timeout bounds the rest)", what, timeout)
