"""The simulated engine (conveyor/engine/sim.py, sim_timing.py): the step time model on pure numbers,
and token streams equal to a reference computed here from the documented rule, not from the sim's code."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.engine.config import EngineConfig
from conveyor.engine.params import Grammar, SamplingParams, StoppingParams
from conveyor.engine.sequence import Sequence
from conveyor.engine.sim import SimEngine, SimRunner
from conveyor.engine.sim_timing import StepTimeModel
from conveyor.engine.step_plan import ScheduledChunk
from tests.engine.sim_reference import reference, reference_vocab

FAST = StepTimeModel(fixed_s=0.0, weight_bytes=0.0, prefill_flops_per_token=0.0)


# --- the step time model ------------------------------------------------------------------------

def test_the_default_step_times_are_an_8b_model_on_an_h200() -> None:
    model = StepTimeModel()
    weights = 16.06e9 / 3.12e12  # 5.147 ms: every step reads the weights once
    assert model.seconds(0, 0) == pytest.approx(0.0015 + weights)
    # 64 rows of 1000 context tokens: 64,000 × 128 KiB = 8.39 GB of K/V more to read
    assert model.seconds(64_000, 0) == pytest.approx(0.0015 + weights + 8.388608e9 / 3.12e12)
    assert 0.009 < model.seconds(64_000, 0) < 0.010
    # a 2048-token prefill: 2048 × 16.06 GFLOP at 545 TFLOP/s = 60.4 ms on top
    assert model.seconds(2048, 2048) - model.seconds(2048, 0) == pytest.approx(2048 * 16.06e9 / 545e12)


def test_a_step_counts_each_chunks_context_and_its_prefill() -> None:
    model = StepTimeModel(fixed_s=1.0, weight_bytes=0.0, kv_bytes_per_token=1.0, memory_bandwidth=1.0,
                          prefill_flops_per_token=10.0, flops=1.0)
    decoding = Sequence("a", [1, 2, 3], token_ids=[1, 2, 3, 4])  # generated one: decodes at 3
    prefilling = Sequence("b", list(range(1, 101)), token_ids=list(range(1, 101)))
    chunks = [ScheduledChunk(decoding, 3, 1), ScheduledChunk(prefilling, 50, 50)]
    assert model.step_seconds(chunks) == 1.0 + (4 + 100) + 50 * 10.0
    first = Sequence("c", [7], token_ids=[7])  # a one-token prompt is a prefill, not a decode
    assert model.step_seconds([ScheduledChunk(first, 0, 1)]) == 1.0 + 1 + 10.0


@pytest.mark.parametrize("field", ["memory_bandwidth", "flops", "kv_bytes_per_token"])
def test_a_rate_or_size_of_zero_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        StepTimeModel(**{field: 0.0})


def test_the_kv_cache_is_its_fraction_of_the_gpu_less_the_weights() -> None:
    """As vLLM's gpu_memory_utilization, whose 0.9 is the default."""
    model = StepTimeModel(weight_bytes=16e9, gpu_memory_bytes=141e9, kv_bytes_per_token=131_072)
    assert model.kv_budget_bytes(0.5) == 54_500_000_000
    assert model.kv_budget_bytes(None) == model.kv_budget_bytes(0.9) == 110_900_000_000
    runner = SimRunner(model, EngineConfig(kv_cache_fraction=0.5, block_size=16), None)
    assert runner.num_blocks == 54_500_000_000 // (131_072 * 16)
    assert SimRunner(model, EngineConfig(kv_cache_memory=2**30), None).num_blocks == 512
    with pytest.raises(ValueError, match="sim_gpu_memory_gb"):
        StepTimeModel(weight_bytes=200e9).kv_budget_bytes(0.9)


def test_a_step_sleeps_its_modelled_time() -> None:
    slept: list[float] = []
    model = StepTimeModel(fixed_s=0.25, weight_bytes=0.0, prefill_flops_per_token=0.0)
    runner = SimRunner(model, EngineConfig(num_blocks=4), None, sleep=slept.append, clock=lambda: 0.0)
    seq = Sequence("a", [1, 2], token_ids=[1, 2])
    logits = runner.execute([ScheduledChunk(seq, 0, 2)])
    assert tuple(logits.shape) == (1, 0) and slept == [pytest.approx(0.25 + 2 * 131_072 / 3.12e12)]


# --- token streams ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(default_model_dir: Path) -> SimEngine:
    return SimEngine.from_model_dir(default_model_dir, EngineConfig(num_blocks=64), FAST)


def run(engine: SimEngine, requests: dict[str, tuple[list[int], SamplingParams, StoppingParams]]) -> dict:
    for rid, (prompt, sampling, stopping) in requests.items():
        engine.add(rid, prompt, sampling, stopping)
    ended: dict[str, list] = {rid: [] for rid in requests}
    while engine.has_unfinished():
        for event in engine.step():
            ended[event.request_id].append(event)
    return ended


def test_the_tokens_follow_the_rule_and_never_a_special_one(engine: SimEngine) -> None:
    vocab = reference_vocab(engine.tokenizer)
    assert not set(vocab) & engine.special_ids and len(vocab) > 40_000
    prompts = {f"r{i}": list(range(100 + i, 140 + 3 * i)) for i in range(6)}
    out = run(engine, {rid: (p, SamplingParams(), StoppingParams(max_new_tokens=20))
                       for rid, p in prompts.items()})
    for rid, prompt in prompts.items():
        assert [e.token_id for e in out[rid]] == reference(vocab, prompt, 20)
        assert out[rid][-1].finish_reason == "length"


def test_preemption_and_a_seed_keep_the_stream(default_model_dir: Path) -> None:
    """8 blocks of 16 for four 30-token prompts growing to 70: sequences are preempted and recomputed."""
    small = SimEngine.from_model_dir(default_model_dir, EngineConfig(num_blocks=8), FAST)
    vocab = reference_vocab(small.tokenizer)
    prompts = {f"p{i}": [500 + i] * 30 for i in range(4)}
    seeded = SamplingParams(do_sample=True, seed=42)
    out = run(small, {rid: (p, seeded, StoppingParams(max_new_tokens=40)) for rid, p in prompts.items()})
    assert small.stats().preemptions > 0
    for rid, prompt in prompts.items():
        assert [e.token_id for e in out[rid]] == reference(vocab, prompt, 40, salt=42)
    assert reference(vocab, prompts["p0"], 40, salt=42) != reference(vocab, prompts["p0"], 40)


def test_a_stop_sequence_ends_the_stream_where_its_text_completes(engine: SimEngine) -> None:
    vocab, prompt = reference_vocab(engine.tokenizer), [9, 8, 7, 6]
    texts = [engine.tokenizer.decode([t]) for t in reference(vocab, prompt, 30)]
    joined = "".join(texts)
    stop = next(t[-2:] for t in texts[5:] if len(t.strip()) >= 2)
    at = joined.find(stop)  # maybe before the token it came from: the stream must stop there
    stopping = StoppingParams(max_new_tokens=30, stop=(stop,), include_stop_str_in_output=True)
    final = run(engine, {"s": (prompt, SamplingParams(), stopping)})["s"][-1]
    assert final.finish_reason == "stop_sequence"
    assert final.generated_text == joined[: at + len(stop)] and final.num_generated_tokens < 30


def test_structured_output_is_refused(engine: SimEngine) -> None:
    with pytest.raises(ValueError, match="structured output"):
        engine.add("g", [1, 2], SamplingParams(grammar=Grammar("regex", "a+")))


def test_choices_draw_with_their_own_seeds_and_prompt_logprobs_come_back(engine: SimEngine) -> None:
    from conveyor.engine.fork import choice_seed

    vocab, prompt = reference_vocab(engine.tokenizer), [11, 12, 13, 14, 15]
    sampling = SamplingParams(do_sample=True, seed=5, prompt_logprobs=1)
    engine.add("n", prompt, sampling, StoppingParams(max_new_tokens=6), n=3)
    out: dict[int, list] = {0: [], 1: [], 2: []}
    while engine.has_unfinished():
        for event in engine.step():
            out[event.choice].append(event)
    for choice, events in out.items():
        assert [e.token_id for e in events] == reference(vocab, prompt, 6, salt=choice_seed(5, choice))
    assert len({tuple(e.token_id for e in events) for events in out.values()}) == 3
    assert [t.id for t in out[0][0].prompt_tokens] == prompt
