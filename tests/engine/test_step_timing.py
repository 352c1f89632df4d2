"""conveyor/engine/step_timing.py: the pieces of each step add up to the step, steps are recorded with their
batch, and leaving the timer puts the engine's own code back (no cost when not profiling)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.engine.attention import cpu_kernel
from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.model.linear import Linear
from conveyor.engine.params import StoppingParams
from conveyor.engine.step_timing import StepTimer


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    return Engine.from_pretrained(tiny_model_dir, EngineConfig(num_blocks=64, block_size=16, device="cpu",
                                                              dtype="float32"))


def test_pieces_add_up_to_each_step_and_the_engine_is_restored(engine: Engine) -> None:
    originals = (Linear.__call__, Linear.residual, cpu_kernel.paged_decode)
    stop = StoppingParams(max_new_tokens=4, ignore_eos=True)
    engine.add("a", list(range(1, 40)), stopping=stop)
    engine.add("b", list(range(5, 9)), stopping=stop)
    timer = StepTimer()
    with timer.install(engine):
        assert "step" in vars(engine)
        while engine.has_unfinished():
            engine.step()
    records = timer.records
    # 2 prompts in one step, then 3 decode steps of both rows.
    batches = [(r.prefill_tokens, r.decode_rows, r.sampled_rows) for r in records]
    assert batches == [(43, 0, 2)] + [(0, 2, 2)] * 3
    for r in records:
        assert sum(r.pieces.values()) == pytest.approx(r.seconds, rel=1e-6)
        assert r.pieces["gemm"] > 0 and r.pieces["lm_head"] > 0 and r.pieces["sampler"] > 0
    assert "prefill_attention" in records[0].pieces and "decode_attention" not in records[0].pieces
    assert "decode_attention" in records[1].pieces and "prefill_attention" not in records[1].pieces
    assert timer.missing == []
    for obj in (engine, engine.runner, engine.runner.model, engine.runner.attention, engine.sampler):
        assert not any(getattr(v, "__qualname__", "").endswith("timed") for v in vars(obj).values())
    assert (Linear.__call__, Linear.residual, cpu_kernel.paged_decode) == originals
