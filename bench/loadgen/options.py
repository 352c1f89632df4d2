"""What every client sends besides the prompt."""

from __future__ import annotations

from dataclasses import dataclass, field


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
