"""One request's outcome, as every client fills it (times in seconds, from perf_counter)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Record:
    sent_at: float = 0.0  # offset from the run's start
    ok: bool = False
    error: str | None = None  # its kind: http_429, http_503, timeout, connect, stream_error, no_tokens, ...
    detail: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)  # gaps between streamed chunks after the first
    webhook_latency: float | None = None  # submit → webhook received (jobs webhook mode)
    _t0: float = 0.0
    _last: float = 0.0

    def start(self) -> None:
        self._t0 = self._last = time.perf_counter()

    def chunk(self) -> None:
        """A chunk with output arrived."""
        now = time.perf_counter()
        if self.ttft is None:
            self.ttft = now - self._t0
        else:
            self.itl.append(now - self._last)
        self._last = now

    def finish(self, output_tokens: int | None = None) -> None:
        self.e2e = time.perf_counter() - self._t0
        if output_tokens is not None:
            self.output_tokens = output_tokens
        self.ok = self.output_tokens > 0 or self.ttft is not None
        if not self.ok:
            self.fail("no_tokens", "the stream ended without output")

    def fail(self, kind: str, detail: str = "") -> None:
        self.ok, self.error, self.detail = False, kind, detail[:300]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (vLLM's TPOT)."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)
