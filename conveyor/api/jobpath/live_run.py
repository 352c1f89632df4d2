"""Which of a client's live events continue its stream (conveyor/api/jobpath/relay.py): the relay
takes a live message's events of the job, and every message queued behind it, as one batch."""

from __future__ import annotations

from conveyor.wire.job import JobEvent


class Run:
    """The live events that continue a client's stream after `last`, taken from messages in order:
    those at or before it were sent already (from the stream, or published twice) and are dropped;
    the first that skips an index starts `gap` (they are read from the event stream instead)."""

    __slots__ = ("done", "events", "gap", "last")

    def __init__(self, last: int) -> None:
        self.last = last
        self.events: list[JobEvent] = []
        self.gap: list[JobEvent] = []
        self.done = False  # the final event is among `events`, or was sent before

    @property
    def open(self) -> bool:
        return not self.done and not self.gap

    def take(self, events: list[JobEvent]) -> None:
        for n, event in enumerate(events):
            if event.index <= self.last:
                if event.final:
                    self.done = True
                    return
                continue
            if event.index > self.last + 1:
                self.gap = events[n:]
                return
            self.last = event.index
            self.events.append(event)
            if event.final:
                self.done = True
                return
