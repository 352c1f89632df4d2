"""What every client sends besides the prompt, and how a run sends the workload."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

BACKENDS = ("completions", "chat", "tgi", "jobs")
JOBS_MODES = ("stream", "poll", "webhook")  # --backend jobs: how the client follows a job


@dataclass(frozen=True)
class Options:
    base_url: str
    model: str = "default"  # the `model` field of OpenAI requests (Conveyor ignores it; vLLM checks it)
    ignore_eos: bool = True  # exactly output_len tokens where the server supports it
    temperature: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)  # e.g. Authorization
    jobs_mode: str = "stream"  # /v1/jobs: stream | poll | webhook
    poll_interval_s: float = 0.05
    webhook_url: str | None = None  # set by the runner in webhook mode (its local receiver)


@dataclass(frozen=True)
class RunConfig:
    backend: str = "completions"
    rate: float = math.inf
    arrival: str = "poisson"
    seed: int = 0
    max_concurrency: int | None = None
    timeout_s: float = 3600.0
    progress: bool = True
    slo: dict[str, float] | None = None
