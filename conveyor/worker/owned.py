"""The jobs a worker owns: read from a jobs stream (or reclaimed) and not yet acknowledged.

The worker's loops share one `Owned`: reading adds jobs, publishing removes those that ended, the
lease loop renews what it holds, cancels look jobs up, and the drain waits until it is empty.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from conveyor.jobqueue.queue import EntryRef
from conveyor.wire.job import JobSpec, Timings
from conveyor.worker.choices import Choices


@dataclass(slots=True)
class InFlight:
    """A job this worker owns: read from the stream (or reclaimed), not yet acknowledged."""

    job_id: str
    entry_id: str
    created_at: float
    deliveries: int = 1
    tokens: int = 0  # tokens in its event stream so far
    started_at: float | None = None
    first_token_at: float | None = None
    cancel_requested: bool = False
    spec: JobSpec | None = None  # tenant, webhook, trace context: for what its end sets off
    choices: Choices | None = None  # a multi-choice job's progress (conveyor/worker/choices.py)
    stream: str = ""  # the jobs stream its entry lives on (shard × band); "" for none (tests)
    # Its final event is written; its entry is being acknowledged, so a lease renewal racing the
    # ack finds it gone from the group's pending entries: ended, not taken over.
    ended: bool = False
    # The api processes that follow its events (the record's `watched`, as TAKE and then each APPEND
    # read it, and the follow notices): its tokens also go out live to each (conveyor/worker/coalesce.py).
    followers: set[str] = field(default_factory=set)

    @property
    def followed(self) -> bool:
        return bool(self.followers)

    @property
    def next_index(self) -> int:
        """The index of the job's next event in its stream."""
        return self.choices.next_index if self.choices is not None else self.tokens

    @property
    def ref(self) -> EntryRef:
        return (self.stream, self.entry_id)

    def timings(self, now: float) -> Timings:
        def since(t: float | None) -> float | None:
            return None if t is None else round(t - self.created_at, 6)

        return Timings(queue_s=since(self.started_at), ttft_s=since(self.first_token_at),
                       total_s=round(now - self.created_at, 6))


class Owned:
    def __init__(self) -> None:
        self._jobs: dict[str, InFlight] = {}
        self.idle = asyncio.Event()  # set while the worker owns no job
        self.idle.set()

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    def get(self, job_id: str) -> InFlight | None:
        return self._jobs.get(job_id)

    def jobs(self) -> list[InFlight]:
        return list(self._jobs.values())

    def add(self, job: InFlight) -> None:
        self._jobs[job.job_id] = job
        self.idle.clear()

    def forget(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)
        if not self._jobs:
            self.idle.set()

    def clear(self) -> None:
        self._jobs.clear()
        self.idle.set()
