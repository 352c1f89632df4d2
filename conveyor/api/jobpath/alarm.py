"""A stream's wake-up for its keep-alive and outage clocks, armed once per period, not per event.

The relay waits on a client's queue between events; it must also wake when a keep-alive comment is
due or a lost connection's outage timeout runs out. A timeout around every wait (asyncio.timeout:
a timer scheduled and cancelled per event) was ~10 % of the api's CPU per streamed token. An alarm
keeps one timer: moving its time later costs two attribute writes, and a timer that fires before
the time it was moved to arms itself again instead of waking the stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

_EARLY_S = 0.001  # the loop may run a timer up to its clock's resolution early: that is on time


class Alarm:
    def __init__(self, wake: Callable[[], object]) -> None:
        self._wake = wake  # called once the time set last has come
        self._at = 0.0  # time.monotonic() seconds
        self._handle: asyncio.TimerHandle | None = None
        self._handle_at = 0.0

    def set(self, at: float) -> None:
        """Wake at `at` (monotonic seconds): the latest call wins."""
        self._at = at
        if self._handle is None or self._handle_at > at:
            self._arm(at)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, at: float) -> None:
        self.cancel()
        self._handle_at = at
        self._handle = asyncio.get_running_loop().call_later(max(0.0, at - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._handle = None
        if time.monotonic() + _EARLY_S >= self._at:
            self._wake()
        else:  # moved later since it was armed
            self._arm(self._at)
