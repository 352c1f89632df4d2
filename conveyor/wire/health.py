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
