"""A job's events held in the worker to go out together (issue 40), on two paths with an interval
each (conveyor/worker/publish_loop.py keeps one Coalescer per path):

- **live**, every `stream_interval_ms` (20): the tokens of jobs an api follows, published to the
  relay. When steps come faster than the interval (a GPU at batch 64 steps every ~15 ms), one
  message carries several steps' tokens, as SGLang's `--stream-interval` does in tokens; an interval
  in time bounds the latency it adds.
- **durable**, every `durable_interval_ms` (250): every job's events, written to its event stream,
  which resumes, replays and late followers read. Redis's cost follows the entries
  (docs/operations/scaling.md): ~16 tokens an entry at a GPU's 15 ms steps instead of ~2.

A job's first token and its final event are never held (time to first token and the end are what
clients wait for, and the first token is the record's milestone). A held event goes out at the first
step after which waiting for the next one would take it past the interval, or when the interval runs
out with no step at all (`next_due`), or at once when asked (`expedite`: an api started following
the job and needs its durable events to fill what it has not seen live). What a worker holds when it
dies is computed again by the job's next owner: at most one durable interval of tokens.
"""

from __future__ import annotations

import math
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
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
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
            if event.final or event.index == 0 or self.interval_s <= 0:
                urgent.add(job.job_id)
        late = now + self._step_s
        return self._release([j for j, h in self._held.items()
                              if j in urgent or h.since + self.interval_s <= late])

    def next_due(self) -> float | None:
        """time.monotonic() when the oldest held event reaches its interval; None: nothing held."""
        if not self._held:
            return None
        return min(h.since for h in self._held.values()) + self.interval_s

    def due(self, now: float | None = None) -> list[Item]:
        """The held events whose interval ran out with no step (the engine paused or slowed down)."""
        now = time.monotonic() if now is None else now
        return self._release([j for j, h in self._held.items() if h.since + self.interval_s <= now])

    def take_all(self) -> list[Item]:
        """Everything held (the worker drains: what it computed goes out before it hands jobs over)."""
        return self._release(list(self._held))

    def drop(self, job_id: str) -> None:
        """A job another worker took over: its held events are not this worker's to write."""
        self._held.pop(job_id, None)

    def expedite(self, job_id: str) -> None:
        """The job's held events go out at the next step, or at once if none comes (`next_due`)."""
        if (held := self._held.get(job_id)) is not None:
            held.since = -math.inf

    def _release(self, job_ids: list[str]) -> list[Item]:
        out: list[Item] = []
        for job_id in job_ids:
            held = self._held.pop(job_id)
            out += [(held.job, event) for event in held.events]
        return out
