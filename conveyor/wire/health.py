"""Health probes: what `GET /ready` answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Ready(BaseModel):
    """`GET /ready`: 200 when Redis answers and a worker's heartbeat is live, else 503."""

    status: Literal["ready", "not_ready"]
    redis: bool
    workers: int
    reason: str | None = None
