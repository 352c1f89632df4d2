"""Where an engine step's time goes, piece by piece: for profiling (benchmarks/step_profile.py) only.

`StepTimer().install(engine)` wraps the pieces of a step on the objects themselves (the step, the
scheduler, the runner, the model's norms, GEMMs, lm_head and attention, the sampler) with
perf_counter timers while it is installed, and puts the originals back when it leaves: an engine
without a timer runs its own code and pays nothing. On CPU torch's ops are synchronous (the
intra-op threads join before an op returns), so the wall time around a call is its cost.

A piece's time is exclusive: a piece called inside another (a GEMM inside the lm_head, the
attention inside the forward) is subtracted from its caller, so the pieces add up to the step.
What is not wrapped stays with its caller: the forward keeps embedding, RoPE, activations and
residual adds; the attention call keeps its K/V writes into the cache; the runner keeps the batch
layout and attention metadata; the step keeps detokenizing, stop checks and events. The model's
C++ layer loop (conveyor/engine/model/layer_loop.cpp) has no Python call inside to wrap: it times its own
calls, and its norms, GEMMs, KV writes and attention join the same pieces (its RoPE and
activations stay with the forward, as above).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from conveyor.engine.attention import cpu_kernel
from conveyor.engine.model.linear import Linear

_ABSENT = object()
# The C++ layer loop's timings (LayerStack.last_timings) -> this timer's pieces; "rope" and "act"
# stay with the forward, as the Python loop's do.
_NATIVE_PIECES = {"norm": "norm", "gemm": "gemm", "kv_write": "attention",
                  "decode_attention": "decode_attention", "prefill_attention": "prefill_attention"}
Namer = Callable[[tuple[Any, ...]], str]  # a piece's name from the call's arguments


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
        self.missing: list[str] = []  # pieces this engine does not have (not wrapped)
        self.calls = 0  # wrapped calls, for the timer's own cost
        self._stack: list[float] = []  # per open call: seconds of the pieces called inside it
        self._pieces: defaultdict[str, float] = defaultdict(float)
        self._batch: tuple[int, int, int] | None = None  # of the step's forward, taken at the call

    @contextmanager
    def install(self, engine: Any) -> Iterator[StepTimer]:
        runner = engine.runner
        model, attention = runner.model, runner.attention
        lm_head = model.lm_head

        def gemm(args: tuple[Any, ...]) -> str:
            return "lm_head" if args[0] is lm_head else "gemm"

        pieces: list[tuple[str | Namer, object, str]] = [
            ("step", engine, "step"),
            ("schedule", engine.scheduler, "schedule"),
            ("execute", runner, "execute"),
            ("sampler", engine.sampler, "sample"),
            ("forward", model, "forward"),
            ("norm", model, "_rms_norm"),
            ("lm_head", model, "logits"),
            (gemm, Linear, "__call__"),
            (gemm, Linear, "residual"),
            ("attention", attention, "forward"),
            ("decode_attention", attention, "_decode"),
            ("decode_attention", cpu_kernel, "paged_decode"),
            ("prefill_attention", attention, "_prefill"),
            ("prefill_attention", cpu_kernel, "paged_prefill"),
        ]
        saved = []
        if (native := getattr(model, "_native_layers", None)) is not None:
            saved.append((model, "_native_layers", vars(model).get("_native_layers", _ABSENT)))
            model._native_layers = self._with_native_pieces(model, native)
        for name, owner, attr in pieces:
            original = getattr(owner, attr, None)
            if original is None:
                self.missing.append(f"{type(owner).__name__}.{attr}")
                continue
            saved.append((owner, attr, vars(owner).get(attr, _ABSENT)))
            setattr(owner, attr, self._timed(name, original))
        try:
            yield self
        finally:
            for owner, attr, before in reversed(saved):
                if before is _ABSENT:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, before)

    def _with_native_pieces(self, model: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn (the C++ layer loop's call), its own timings added to the pieces they name and taken
        out of the caller's (the forward's) time."""
        stack, pieces = self._stack, self._pieces

        def native(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            for name, seconds in model.layer_stack.last_timings():
                piece = _NATIVE_PIECES.get(name)
                if piece is not None and seconds > 0:  # 0: not called in this step
                    pieces[piece] += seconds
                    if stack:
                        stack[-1] += seconds
            return out

        return native

    def _timed(self, name: str | Namer, fn: Callable[..., Any]) -> Callable[..., Any]:
        stack, pieces = self._stack, self._pieces

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if name == "execute":  # `sample` reads the sequence, which the step then extends
                chunks = args[0]
                self._batch = (sum(1 for c in chunks if c.length == 1),
                               sum(c.length for c in chunks if c.length != 1),
                               sum(1 for c in chunks if c.sample))
            stack.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                inner = stack.pop()
                pieces[name if isinstance(name, str) else name(args)] += elapsed - inner
                if stack:
                    stack[-1] += elapsed
                elif name == "step":
                    self._end_step(elapsed)

        return timed

    def _end_step(self, seconds: float) -> None:
        batch, self._batch = self._batch, None
        if batch is not None:  # a step that scheduled nothing ran no forward: not a step kind
            self.records.append(StepRecord(*batch, seconds=seconds, pieces=dict(self._pieces)))
        self._pieces.clear()
