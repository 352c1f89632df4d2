"""The stream interval (issue 40): a job's token events wait in the worker up to `stream_interval_ms`
to go out with its next ones — one event stream entry and one live message for several steps'
tokens — when steps come faster than the interval (a GPU at batch 64 steps every ~15 ms). SGLang's
`--stream-interval` does the same in tokens; an interval in time bounds the latency it adds.

A job's first token and its final event are never held (time to first token and the end are what
clients wait for). A held event goes out at the first step after which waiting for the next one would
take it past the interval, or when the interval runs out with no step at all (`next_due`). What a
worker holds when it dies is computed again by the job's next owner: at most one interval of tokens.

A job no api follows (`InFlight.followed`: async jobs nobody streams, Batch lines) waits the longer
`unfollowed_interval_ms`: its events only need to be durable, and Redis's cost follows the entries
(docs/operations/scaling.md), so ~16 tokens an entry instead of ~2 at a GPU's 15 ms steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from conveyor.wire.job import JobEvent
from conveyor.worker.owned import InFlight

Item = tuple[InFlight, JobEvent]


@dataclass(slots=True)
class _Held:
    job: InFlight
    since: float  # time.monotonic() when its oldest event was emitted
    events: list[JobEvent] = field(default_factory=list)


class Coalescer:
    def __init__(self, interval_s: float, unfollowed_s: float = 0.0) -> None:
        self.interval_s = interval_s
        self.unfollowed_s = max(interval_s, unfollowed_s)
        self._held: dict[str, _Held] = {}
        self._step_s = 0.0  # the last interval between two steps' outputs: the wait for the next one
        self._last_step: float | None = None

    def __len__(self) -> int:
        return len(self._held)

    def step(self, items: list[Item], now: float | None = None) -> list[Item]:
        """Takes one step's events (stamped with their emission time); returns what goes out now, in
        order per job: the held events that could not wait for the next step, and the urgent ones."""
        now = time.monotonic() if now is None else now
        if self._last_step is not None:
            self._step_s = now - self._last_step
        self._last_step = now
        stamp = round(time.time(), 3)
        urgent: set[str] = set()
        for job, event in items:
            event.at = stamp
            held = self._held.get(job.job_id)
            if held is None:
                held = self._held[job.job_id] = _Held(job, now)
            held.events.append(event)
            if event.final or event.index == 0 or self._interval(job) <= 0:
                urgent.add(job.job_id)
        late = now + self._step_s
        return self._release([j for j, h in self._held.items()
                              if j in urgent or h.since + self._interval(h.job) <= late])

    def next_due(self) -> float | None:
        """time.monotonic() when the oldest held event reaches its interval; None: nothing held."""
        if not self._held:
            return None
        return min(h.since + self._interval(h.job) for h in self._held.values())

    def due(self, now: float | None = None) -> list[Item]:
        """The held events whose interval ran out with no step (the engine paused or slowed down)."""
        now = time.monotonic() if now is None else now
        return self._release([j for j, h in self._held.items() if h.since + self._interval(h.job) <= now])

    def take_all(self) -> list[Item]:
        """Everything held (the worker drains: what it computed goes out before it hands jobs over)."""
        return self._release(list(self._held))

    def drop(self, job_id: str) -> None:
        """A job another worker took over: its held events are not this worker's to write."""
        self._held.pop(job_id, None)

    def _interval(self, job: InFlight) -> float:
        return self.interval_s if job.followed else self.unfollowed_s

    def _release(self, job_ids: list[str]) -> list[Item]:
        out: list[Item] = []
        for job_id in job_ids:
            held = self._held.pop(job_id)
            out += [(held.job, event) for event in held.events]
        return out
