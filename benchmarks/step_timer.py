"""Where an engine step's time goes, piece by piece: a StepObserver (conveyor/engine/step_observer.py)
for benchmarks/step_profile.py.

`with StepTimer().attached(engine)` observes every step the engine runs inside the block. On CPU
torch's ops are synchronous (the intra-op threads join before an op returns), so the wall time
between a piece's start and stop is its cost.

A piece's time is exclusive: a piece inside another (the attention inside the forward, the lm_head
inside the runner) is subtracted from its caller, so the pieces add up to the step. What the engine
does not report stays with its caller: the forward keeps embedding, RoPE, activations, residual
adds and (in the Python layer loop) the norms and GEMMs; the runner keeps the batch layout and
attention metadata; the step keeps detokenizing, stop checks and events. The C++ layer loop times
its own calls: its norms, GEMMs, KV writes and attention join the pieces below and leave the
forward's time (its RoPE and activations stay with the forward, as above).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# The C++ layer loop's timings -> this timer's pieces; "rope" and "act" stay with the forward.
NATIVE_PIECES = {"norm": "norm", "gemm": "gemm", "kv_write": "attention",
                 "decode_attention": "decode_attention", "prefill_attention": "prefill_attention"}


@dataclass(slots=True)
class StepRecord:
    """One step that ran a forward: its batch and the exclusive seconds of each piece."""

    decode_rows: int  # chunks of one token
    prefill_tokens: int  # tokens of longer chunks
    sampled_rows: int  # rows that went through the lm_head and the sampler
    seconds: float
    pieces: dict[str, float] = field(default_factory=dict)


class StepTimer:
    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self.calls = 0  # observed pieces, for the timer's own cost
        self._open: list[tuple[str, float, float]] = []  # (piece, start, seconds of pieces inside it)
        self._pieces: defaultdict[str, float] = defaultdict(float)
        self._batch: tuple[int, int, int] | None = None  # of the step's forward

    @contextmanager
    def attached(self, engine: Any) -> Iterator[StepTimer]:
        engine.observe(self)
        try:
            yield self
        finally:
            engine.observe(None)

    def start(self, piece: str) -> None:
        self.calls += 1
        self._open.append((piece, time.perf_counter(), 0.0))

    def stop(self, piece: str) -> None:
        name, started, inner = self._open.pop()
        if name != piece:
            raise RuntimeError(f"piece {piece!r} stopped while {name!r} was open")
        elapsed = time.perf_counter() - started
        self._pieces[piece] += elapsed - inner
        if self._open:
            self._add_inner(elapsed)
        elif piece == "step":
            self._end_step(elapsed)

    def batch(self, decode_rows: int, prefill_tokens: int, sampled_rows: int) -> None:
        self._batch = (decode_rows, prefill_tokens, sampled_rows)

    def native(self, timings: Sequence[tuple[str, float]]) -> None:
        for name, seconds in timings:
            piece = NATIVE_PIECES.get(name)
            if piece is not None and seconds > 0:  # 0: not called in this step
                self._pieces[piece] += seconds
                self._add_inner(seconds)

    def _add_inner(self, seconds: float) -> None:
        if self._open:
            name, started, inner = self._open[-1]
            self._open[-1] = (name, started, inner + seconds)

    def _end_step(self, seconds: float) -> None:
        batch, self._batch = self._batch, None
        if batch is not None:  # a step that scheduled nothing ran no forward: not a step kind
            self.records.append(StepRecord(*batch, seconds=seconds, pieces=dict(self._pieces)))
        self._pieces.clear()
