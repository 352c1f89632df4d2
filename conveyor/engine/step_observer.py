"""An optional observer of where an engine step's time goes, for profilers (benchmarks/step_profile.py).

`Engine.observe(observer)` hands it to the engine, its model runner and the model; each then calls
`start(piece)` and `stop(piece)` around its pieces of a step, nested (a piece may run inside
another): "step" (the whole step), "schedule", "execute" (the runner: batch layout and attention
metadata), "forward" (the model), "attention" (a layer's attention call, in the Python layer loop),
"lm_head" (the logits), "sampler". `batch` tells it the step's batch when the runner lays it out;
`native` hands it the C++ layer loop's own timings of the forward that just ran, (name, seconds)
pairs: "norm", "gemm", "rope", "act", "kv_write", "decode_attention", "prefill_attention" (0: not
called). With no observer (the default) every call site is one `is None` check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class StepObserver(Protocol):
    def start(self, piece: str) -> None: ...

    def stop(self, piece: str) -> None: ...

    def batch(self, decode_rows: int, prefill_tokens: int, sampled_rows: int) -> None: ...

    def native(self, timings: Sequence[tuple[str, float]]) -> None: ...
