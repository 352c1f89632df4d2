"""The relay's one live channel (Keys.live): a worker publishes one message per step to each api
process that follows any of its jobs, with every such job's new events (conveyor/wire/event_batch.py
dump_live); the router parses it once and hands each job's events to that job's clients. A signal of
the channel (RESYNC, DOWN: conveyor/jobqueue/pubsub/subscriptions.py) concerns every job on it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from conveyor.jobqueue.pubsub.subscriptions import Listener, Signal
from conveyor.wire.event_batch import load_live
from conveyor.wire.job import JobEvent

log = logging.getLogger("conveyor.api.jobpath.relay")


class LiveRouter:
    def __init__(self, on_event: Callable[[JobEvent], object] | None = None) -> None:
        self._on_event = on_event  # each live event (the relay measures its lag)
        self._clients: dict[str, set[Listener]] = {}

    def __len__(self) -> int:
        return sum(len(listeners) for listeners in self._clients.values())

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._clients

    def add(self, job_id: str, listener: Listener) -> None:
        self._clients.setdefault(job_id, set()).add(listener)

    def remove(self, job_id: str, listener: Listener) -> None:
        listeners = self._clients.get(job_id)
        if listeners is not None:
            listeners.discard(listener)
            if not listeners:
                del self._clients[job_id]

    def put(self, item: Signal) -> None:
        for listeners in self._clients.values():
            for listener in listeners:
                listener.put(item)

    def message(self, data: str) -> None:
        try:
            batches = load_live(data)
        except ValueError:
            log.warning("dropping a malformed live message")
            return
        for job_id, events in batches.items():
            if self._on_event is not None:
                for event in events:
                    self._on_event(event)
            for listener in self._clients.get(job_id, ()):
                listener.put(events)  # shared: a listener's reader only reads it
