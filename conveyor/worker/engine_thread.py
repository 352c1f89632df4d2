"""Runs the engine's step loop in its own thread, so the asyncio loop stays free for Redis I/O.

Commands (add, abort) go in through a queue and are applied between steps, so an abort takes
effect before the next step and frees the request's KV blocks; each step's events come out through
a callback scheduled on the asyncio loop. Publishing step k therefore overlaps the compute of step
k+1. A request the engine refuses (it could never fit) comes out as `rejected`, not as a crash.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.engine.engine import Engine, StepInfo
from conveyor.engine.events import TokenEvent
from conveyor.engine.params import SamplingParams, StoppingParams
from conveyor.wire.heartbeat import EngineLoad
from conveyor.worker.liveness import IDLE_TICK

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
    n: int = 1  # sequences of a multi-choice job
    resumed: dict[int, list[int]] | None = None  # a resumed one's unfinished choices and their tokens


@dataclass(slots=True)
class AbortCommand:
    request_id: str


@dataclass(slots=True)
class SummaryCommand:
    """Asks for the prefix cache's block hashes (conveyor/jobqueue/placement.py), taken between two steps."""

    limit: int
    deliver: Callable[[list[int]], Any]


Command = list[AddCommand] | AbortCommand | SummaryCommand | None


@dataclass(slots=True)
class StepOutput:
    events: list[TokenEvent] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (request id, why)


class EngineThread:
    def __init__(
        self,
        engine: Engine,
        loop: asyncio.AbstractEventLoop,
        on_output: Callable[[StepOutput], Any],
        on_error: Callable[[BaseException], Any],
        on_step: Callable[[StepInfo], Any] | None = None,
    ) -> None:
        self.engine = engine
        self._on_step = on_step  # called on the engine thread after each forward: keep it cheap
        self._loop = loop
        self._on_output = on_output
        self.stats: EngineLoad = engine.stats()  # as of the last step; read from any thread
        self._on_error = on_error
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._pending_adds = 0  # added but not yet seen by the engine: counts against capacity
        self._lock = threading.Lock()
        self._stopping = False
        self._progress_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._commands.put(None)
        self._thread.join(timeout=30)

    def progress_at(self) -> float | None:
        """Monotonic time of the step loop's last iteration (idle ones too); None before it starts
        and once it is told to stop (a stop on purpose is no stall)."""
        return None if self._stopping else self._progress_at

    def add(self, *commands: AddCommand) -> None:
        """Queue requests; the ones given together reach the engine before the same step."""
        with self._lock:
            self._pending_adds += len(commands)
        self._commands.put(list(commands))

    def abort(self, request_id: str) -> None:
        self._commands.put(AbortCommand(request_id))

    def cached_prefixes(self, limit: int) -> asyncio.Future[list[int]]:
        """The hashes of up to `limit` cached prefix blocks, taken on the engine thread between two
        steps (the block manager is the engine thread's alone: no lock on the step loop)."""
        future: asyncio.Future[list[int]] = self._loop.create_future()

        def settle(hashes: list[int]) -> None:
            if not future.done():
                future.set_result(hashes)

        self._commands.put(SummaryCommand(limit, lambda h: self._loop.call_soon_threadsafe(settle, h)))
        return future

    def capacity(self) -> int:
        with self._lock:
            pending = self._pending_adds
        return max(0, self.engine.capacity() - pending)

    def free_slots(self) -> int:
        """Batch slots free even while capacity() is 0 for a waiting job (see ReadLoop._read)."""
        with self._lock:
            pending = self._pending_adds
        return max(0, self.engine.free_slots() - pending)

    def _apply(self, command: Command, out: StepOutput) -> None:
        if isinstance(command, list):
            for add in command:
                self._add(add, out)
        elif isinstance(command, AbortCommand):
            out.events.extend(self.engine.abort(command.request_id))
        elif isinstance(command, SummaryCommand):
            command.deliver(self.engine.block_manager.cached_hashes(command.limit))

    def _add(self, command: AddCommand, out: StepOutput) -> None:
        try:
            self.engine.add(
                command.request_id,
                command.prompt_ids,
                command.sampling,
                command.stopping,
                priority=command.priority,
                deadline=command.deadline,
                generated=command.generated,
                n=command.n,
                resumed=command.resumed,
            )
        except ValueError as exc:  # e.g. it can never fit in this engine's KV cache
            out.rejected.append((command.request_id, str(exc)))
        finally:
            with self._lock:
                self._pending_adds -= 1

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._progress_at = time.monotonic()
                out = StepOutput()
                # Block for a command only when there is nothing to compute, and not for longer than
                # IDLE_TICK: an idle loop still shows progress (conveyor/worker/liveness.py).
                if not self.engine.has_unfinished():
                    try:
                        self._apply(self._commands.get(timeout=IDLE_TICK), out)
                    except queue.Empty:
                        continue
                while True:
                    try:
                        self._apply(self._commands.get_nowait(), out)
                    except queue.Empty:
                        break
                if self._stopping:
                    break
                if self.engine.has_unfinished():
                    before = self.engine.last_step
                    out.events.extend(self.engine.step())
                    step = self.engine.last_step
                    if self._on_step is not None and step is not None and step is not before:
                        self._on_step(step)
                self.stats = self.engine.stats()
                if out.events or out.rejected:
                    self._loop.call_soon_threadsafe(self._on_output, out)
        except BaseException as exc:  # the worker must learn that its engine died
            log.exception("engine thread failed")
            self._loop.call_soon_threadsafe(self._on_error, exc)
