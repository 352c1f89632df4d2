"""Health probes: what `GET /ready` answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Ready(BaseModel):
    """`GET /ready`: 200 when this api can take a request — Redis accepts writes and the relay is
    subscribed — else 503. Live workers are counted but do not decide it: with none, jobs wait in the
    queue (an autoscaler scaling workers from zero needs the api in its Service meanwhile)."""

    status: Literal["ready", "not_ready"]
    redis: bool = Field(description="Redis accepted this api's probe write.")
    relay: bool = Field(description="The relay's pub/sub connections are up (streams get live events).")
    workers: int = Field(description="Workers whose heartbeat is live (-1: unknown, Redis did not answer).")
    reason: str | None = None


class QueueDepth(BaseModel):
    """`GET /queue`: the fleet's queue as an autoscaler reads it (KEDA's `metrics-api` trigger on
    `workers_wanted` with `targetValue: "1"`, deploy/k8s/base/worker-scaler.yaml). Counted from every
    stream a job can wait in: each shard's priority bands and its workers' own streams."""

    waiting: int = Field(description="Jobs no worker has read yet.")
    running: int = Field(description="Jobs a worker has read and not yet finished.")
    jobs: int = Field(description="waiting + running.")
    max_batch_size: int = Field(description="The jobs one worker runs at once (the setting).")
    workers_wanted: int = Field(description="ceil(jobs / max_batch_size): workers enough for every job to "
                                "hold a batch slot; 0 only when no job is waiting or running.")

    @classmethod
    def of(cls, waiting: int, running: int, max_batch_size: int) -> QueueDepth:
        jobs = waiting + running
        return cls(waiting=waiting, running=running, jobs=jobs, max_batch_size=max_batch_size,
                   workers_wanted=-(-jobs // max_batch_size))
