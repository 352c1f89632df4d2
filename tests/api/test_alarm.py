"""The relay's keep-alive and outage alarm (conveyor/api/jobpath/alarm.py): it wakes at the time set
last, once, whether that time moved later (the timer re-arms itself) or earlier, and never once
cancelled."""

from __future__ import annotations

import asyncio
import time

from conveyor.api.jobpath.alarm import Alarm


class Wakes:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.event = asyncio.Event()

    def __call__(self) -> None:
        self.times.append(time.monotonic())
        self.event.set()


async def test_a_time_moved_later_wakes_once_at_the_later_time() -> None:
    wakes = Wakes()
    alarm = Alarm(wakes)
    start = time.monotonic()
    alarm.set(start + 0.02)
    alarm.set(start + 0.1)  # as the relay does after each event: the armed timer stays
    await wakes.event.wait()
    assert wakes.times[0] >= start + 0.1 - 0.001
    later = Wakes()  # a second alarm, to wait on something after the first one's timer is gone
    Alarm(later).set(time.monotonic() + 0.05)
    await later.event.wait()
    assert len(wakes.times) == 1


async def test_a_time_moved_earlier_wakes_at_the_earlier_time() -> None:
    wakes = Wakes()
    alarm = Alarm(wakes)
    alarm.set(time.monotonic() + 3600)
    start = time.monotonic()
    alarm.set(start + 0.02)
    await wakes.event.wait()  # an hour's timer would time the test out
    assert wakes.times == [wakes.times[0]] and wakes.times[0] >= start + 0.02 - 0.001


async def test_a_cancelled_alarm_never_wakes() -> None:
    wakes, other = Wakes(), Wakes()
    alarm = Alarm(wakes)
    alarm.set(time.monotonic() + 0.01)
    alarm.cancel()
    Alarm(other).set(time.monotonic() + 0.05)
    await other.event.wait()
    assert wakes.times == []
