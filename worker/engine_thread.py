"""Runs the engine's step loop in its own thread, so the asyncio loop stays free for Redis I/O.

Commands (add, abort) go in through a queue and are applied between steps; each step's events
come out through a callback scheduled on the asyncio loop. Publishing step k therefore overlaps
the compute of step k+1.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.engine import Engine
from engine.events import TokenEvent
from engine.params import SamplingParams, StoppingParams

log = logging.getLogger(__name__)


@dataclass(slots=True)
class AddCommand:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    stopping: StoppingParams
    priority: int = 0
    deadline: float | None = None
    generated: list[int] = field(default_factory=list)


@dataclass(slots=True)
class AbortCommand:
    request_id: str


class EngineThread:
    def __init__(
        self,
        engine: Engine,
        loop: asyncio.AbstractEventLoop,
        on_events: Callable[[list[TokenEvent]], Any],
        on_error: Callable[[BaseException], Any],
    ) -> None:
        self.engine = engine
        self._loop = loop
        self._on_events = on_events
        self._on_error = on_error
        self._commands: queue.SimpleQueue[AddCommand | AbortCommand | None] = queue.SimpleQueue()
        self._pending_adds = 0  # added but not yet seen by the engine: counts against capacity
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._commands.put(None)
        self._thread.join(timeout=30)

    def add(self, command: AddCommand) -> None:
        with self._lock:
            self._pending_adds += 1
        self._commands.put(command)

    def abort(self, request_id: str) -> None:
        self._commands.put(AbortCommand(request_id))

    def capacity(self) -> int:
        with self._lock:
            pending = self._pending_adds
        return max(0, self.engine.capacity() - pending)

    def _apply(self, command: AddCommand | AbortCommand | None, events: list[TokenEvent]) -> None:
        if isinstance(command, AddCommand):
            self.engine.add(
                command.request_id,
                command.prompt_ids,
                command.sampling,
                command.stopping,
                priority=command.priority,
                deadline=command.deadline,
                generated=command.generated,
            )
            with self._lock:
                self._pending_adds -= 1
        elif isinstance(command, AbortCommand):
            event = self.engine.abort(command.request_id)
            if event is not None:
                events.append(event)

    def _run(self) -> None:
        try:
            while not self._stopping:
                events: list[TokenEvent] = []
                # Block for a command only when there is nothing to compute.
                if not self.engine.has_unfinished():
                    self._apply(self._commands.get(), events)
                while True:
                    try:
                        self._apply(self._commands.get_nowait(), events)
                    except queue.Empty:
                        break
                if self._stopping:
                    break
                if self.engine.has_unfinished():
                    events.extend(self.engine.step())
                if events:
                    self._loop.call_soon_threadsafe(self._on_events, events)
        except BaseException as exc:  # the worker must learn that its engine died
            log.exception("engine thread failed")
            self._loop.call_soon_threadsafe(self._on_error, exc)
