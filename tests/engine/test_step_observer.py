"""conveyor/engine/step_observer.py: an observer sees every step's pieces, nested, with the step's
batch and the C++ layer loop's own timings; benchmarks/step_timer.py's pieces add up to each step;
and with the observer gone the engine reports nothing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from benchmarks.step_timer import StepTimer
from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.params import StoppingParams


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    # No prefix caching: every test runs the same prompts, and each should prefill them in full.
    config = EngineConfig(num_blocks=64, block_size=16, device="cpu", dtype="float32",
                          enable_prefix_caching=False)
    return Engine.from_pretrained(tiny_model_dir, config)


class Recorder:
    def __init__(self) -> None:
        self.steps: list[list[tuple[str, object]]] = []
        self._open: list[str] = []

    def start(self, piece: str) -> None:
        if piece == "step":
            self.steps.append([])
        self._open.append(piece)
        self.steps[-1].append(("start", piece))

    def stop(self, piece: str) -> None:
        assert self._open.pop() == piece  # nested: the last piece started is the one that stops
        self.steps[-1].append(("stop", piece))

    def batch(self, decode_rows: int, prefill_tokens: int, sampled_rows: int) -> None:
        self.steps[-1].append(("batch", (decode_rows, prefill_tokens, sampled_rows)))

    def native(self, timings: Sequence[tuple[str, float]]) -> None:
        self.steps[-1].append(("native", dict(timings)))


def _run(engine: Engine) -> None:
    stop = StoppingParams(max_new_tokens=4, ignore_eos=True)
    engine.add("a", list(range(1, 40)), stopping=stop)
    engine.add("b", list(range(5, 9)), stopping=stop)
    while engine.has_unfinished():
        engine.step()


def test_the_observer_sees_each_steps_pieces_and_batch(engine: Engine) -> None:
    recorder = Recorder()
    engine.observe(recorder)
    try:
        _run(engine)
    finally:
        engine.observe(None)
    # 2 prompts in one step, then 3 decode steps of both rows.
    batches = [next(v for k, v in step if k == "batch") for step in recorder.steps]
    assert batches == [(0, 43, 2)] + [(2, 0, 2)] * 3
    native = engine.runner.model.layer_stack is not None
    for i, step in enumerate(recorder.steps):
        started = {v for k, v in step if k == "start"}
        assert {"step", "schedule", "execute", "forward", "lm_head", "sampler"} <= started
        assert step[0] == ("start", "step") and step[-1] == ("stop", "step")
        if native:  # the C++ loop's own timings, of the attention kernel this step ran
            timings = next(v for k, v in step if k == "native")
            assert isinstance(timings, dict) and timings["gemm"] > 0
            assert (timings["prefill_attention"] > 0) == (i == 0)
            assert (timings["decode_attention"] > 0) == (i > 0)
        else:
            assert "attention" in started
    assert engine.observer is None and engine.runner.observer is None and engine.runner.model.observer is None
    _run(engine)  # observed by nobody: nothing recorded
    assert len(recorder.steps) == 4


def test_the_step_timers_pieces_add_up_to_each_step(engine: Engine) -> None:
    timer = StepTimer()
    with timer.attached(engine):
        assert engine.observer is timer
        _run(engine)
    assert engine.observer is None
    records = timer.records
    batches = [(r.prefill_tokens, r.decode_rows, r.sampled_rows) for r in records]
    assert batches == [(43, 0, 2)] + [(0, 2, 2)] * 3
    for r in records:
        assert sum(r.pieces.values()) == pytest.approx(r.seconds, rel=1e-6)
        assert r.pieces["lm_head"] > 0 and r.pieces["sampler"] > 0
    if engine.runner.model.layer_stack is not None:
        assert all(r.pieces["gemm"] > 0 for r in records)
        assert "prefill_attention" in records[0].pieces and "decode_attention" not in records[0].pieces
        assert "decode_attention" in records[1].pieces and "prefill_attention" not in records[1].pieces
