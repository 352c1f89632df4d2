"""The forward's layer loop in C++ (conveyor/engine/native/layer_loop.cpp) against the Python loop on the same
kernels: the same tokens and logprobs bit for bit, over steps with decode rows only, prefill chunks
only, both, one padded row, and a prefill long enough for the MLP's row slices."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from benchmarks.step_timer import StepTimer
from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.model import layer_stack
from conveyor.engine.native import fused_ops
from conveyor.engine.params import StoppingParams

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    if fused_ops.load() is None:
        pytest.skip("the fused ops could not be built here (see the logged warning)")
    # A 700-token prefill budget: a longer prompt goes in chunks, beside other sequences' decode rows.
    config = EngineConfig(enable_prefix_caching=False, device="cpu", kv_cache_memory=64 * 1024**2,
                          max_batch_prefill_tokens=700)
    engine = Engine.from_pretrained(tiny_model_dir, config)
    if engine.runner.model.layer_stack is None:
        pytest.skip("the C++ layer loop is not used here (conveyor/engine/model/layer_stack.py says when)")
    return engine


Outputs = dict[str, list[tuple[int, float | None]]]


def generate(engine: Engine, prompts: list[list[int]], native: bool) -> Outputs:
    model = engine.runner.model
    stack = model.layer_stack
    model.layer_stack = stack if native else None
    calls = 0
    if native:  # counted, so that a test cannot pass with the C++ loop not called
        original = stack.forward

        class Counting:
            def forward(self, *args: object) -> torch.Tensor:
                nonlocal calls
                calls += 1
                return original(*args)

        model.layer_stack = Counting()
    steps = 0
    try:
        for i, ids in enumerate(prompts):
            engine.add(str(i), ids, stopping=StoppingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
        out: Outputs = {}
        while engine.has_unfinished():
            steps += 1
            for e in engine.step():
                if e.token_id is not None:
                    out.setdefault(e.request_id, []).append((e.token_id, e.logprob))
    finally:
        model.layer_stack = stack
    if native:  # every step's forward, its prefill chunks' too, ran the C++ loop
        assert calls == steps
    return out


@pytest.mark.parametrize(
    "prompts",
    [
        [[5, 6, 7]],  # one row: padded up to the GEMMs' exact minimum in every decode step
        # A first step of every short prompt and the long one's first chunk (sliced: over 512 rows),
        # then its second chunk beside the others' decode rows, then decode rows only.
        [[1, 2, 3], list(range(100, 160)), [7] * 17, list(range(3000, 3301, 3)), list(range(20, 1020))],
        [list(range(10, 650)), [9] * 40],  # prefill only, then decode only
    ],
    ids=["single", "mixed", "prefill-only"],
)
def test_the_cpp_loop_gives_the_python_loops_bits(engine: Engine, prompts: list[list[int]]) -> None:
    native = generate(engine, prompts, native=True)
    assert [len(native[str(i)]) for i in range(len(prompts))] == [NEW_TOKENS] * len(prompts)
    assert generate(engine, prompts, native=False) == native


def test_the_step_profile_times_the_cpp_loops_pieces(engine: Engine) -> None:
    model = engine.runner.model
    stack = model.layer_stack
    timer = StepTimer()
    with timer.attached(engine):
        assert model.layer_stack is stack
        engine.add("p", list(range(1, 40)), stopping=StoppingParams(max_new_tokens=3, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    assert model.observer is None  # detached again
    prefill, *decode = timer.records
    for r in timer.records:
        assert sum(r.pieces.values()) == pytest.approx(r.seconds, rel=1e-6)
        assert r.pieces["norm"] > 0 and r.pieces["gemm"] > 0 and r.pieces["attention"] > 0
    assert prefill.pieces.get("prefill_attention", 0) > 0 and "decode_attention" not in prefill.pieces
    assert all(r.pieces.get("decode_attention", 0) > 0 for r in decode) and len(decode) == 2
    # (The sums above hold only if the loop's pieces are taken out of the forward's own time.)
    timings = dict(stack.last_timings())  # of the last forward: a decode step
    pieces = {"norm", "gemm", "rope", "kv_write", "decode_attention", "prefill_attention", "act"}
    assert set(timings) == pieces
    assert timings["prefill_attention"] == 0 and timings["decode_attention"] > 0


def test_a_plan_that_does_not_cover_the_rows_is_refused(engine: Engine) -> None:
    model = engine.runner.model
    module = fused_ops.load()
    assert module is not None
    n, hidden = 3, model.hidden_size
    heads, kv, hd = model.num_heads, model.num_kv_heads, model.head_dim
    # Two decode rows said, three rows given, and no prefill chunk for the third.
    step = module.StepAttention(torch.zeros(n, dtype=torch.long), torch.zeros(2, 1, dtype=torch.int32),
                                torch.ones(2, dtype=torch.int32), None, None, None, 1.0)
    caches = [torch.zeros(2, kv, 16, hd)] * model.num_layers
    with pytest.raises(RuntimeError, match="attention plan must cover rows"):
        model.layer_stack.forward(torch.zeros(n, hidden), torch.zeros(n, hd), torch.zeros(n, hd), n,
                                  torch.zeros(n, hidden), torch.zeros(n, heads + kv, hd),
                                  torch.zeros(n, model.intermediate_size), torch.zeros(n, heads, hd),
                                  caches, caches, step)


def test_a_loop_that_cannot_be_built_leaves_the_python_loop(engine: Engine,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    model = engine.runner.model
    fused = model.fused

    class Broken:  # as a torch release whose oneDNN op changed its signature would make it
        def LayerStack(self, *args: object) -> None:  # noqa: N802 - the extension's class name
            raise RuntimeError("Tried to access or call an operator with a wrong signature")

    model.fused = Broken()  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.WARNING):
            assert layer_stack.build_layer_stack(model) is None
    finally:
        model.fused = fused
    assert "the forward keeps its Python loop: Tried to access" in caplog.text
