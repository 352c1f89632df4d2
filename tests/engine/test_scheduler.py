"""Scheduler: budgets, chunked prefill, admission order, preemption, expiry, abort, capacity.

No model: `Sim` plays the forward. It keeps a model of the KV memory (per block slot, the exact
prefix whose KV was written there), checks that every chunk reads back its own prefix, and samples
a fake token that is a function of the context read from that memory: wrong bookkeeping changes
the output, and a preempted request must give the same tokens as an undisturbed one.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.engine.block_manager import BlockManager
from conveyor.engine.config import EngineConfig
from conveyor.engine.params import StoppingParams
from conveyor.engine.scheduler import Scheduler
from conveyor.engine.sequence import FinishReason, Sequence, SequenceStatus
from conveyor.engine.step_plan import SchedulerOutput

BS = 4


def fake_token(context: tuple[int, ...]) -> int:
    return (sum(context) * 31 + len(context)) % 50


def reference(prompt: list[int], max_new: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_new):
        tokens.append(fake_token(tuple(tokens)))
    return tokens[len(prompt) :]


class Sim:
    def __init__(self, num_blocks: int = 64, clock: list[float] | None = None, **limits: int | str) -> None:
        self.config = EngineConfig(block_size=BS, num_blocks=num_blocks, **limits)
        self.bm = BlockManager(num_blocks, BS)
        self.now = clock if clock is not None else [0.0]
        self.sched = Scheduler(self.config, self.bm, clock=lambda: self.now[0])
        self.kv: dict[tuple[int, int], tuple[int, ...]] = {}
        self.seqs: dict[str, Sequence] = {}
        self.outputs: dict[str, list[int]] = {}
        self.steps: list[SchedulerOutput] = []

    def add(self, rid: str, prompt: list[int] | int, max_new: int = 4, **kw: object) -> Sequence:
        # An int: that many tokens, the first one unique so that prompts do not share a prefix.
        tokens = [100 + len(self.seqs)] + list(range(1, prompt)) if isinstance(prompt, int) else prompt
        seq = Sequence(rid, tokens, stopping=StoppingParams(max_new_tokens=max_new), **kw)  # type: ignore[arg-type]
        self.sched.add(seq)
        self.seqs[rid] = seq
        return seq

    def step(self) -> SchedulerOutput:
        was_running = {s.request_id for s in self.seqs.values() if s.status == SequenceStatus.RUNNING}
        out = self.sched.schedule()
        self._check(out, was_running)
        samples = {}
        for c in out.chunks:
            seq = c.seq
            for pos in range(c.start):
                assert self.kv[seq.block_table[pos // BS], pos % BS] == tuple(seq.token_ids[: pos + 1])
            for pos in range(c.start, c.start + c.length):
                self.kv[seq.block_table[pos // BS], pos % BS] = tuple(seq.token_ids[: pos + 1])
            last = c.start + c.length - 1
            samples[seq.request_id] = fake_token(self.kv[seq.block_table[last // BS], last % BS])
        self.sched.complete(out)
        for c in out.chunks:
            seq = c.seq
            if c.sample and not seq.is_finished:
                seq.append_token(samples[seq.request_id])
                if seq.num_generated >= seq.stopping.max_new_tokens:
                    self.sched.finish(seq, FinishReason.LENGTH)
                    self.outputs[seq.request_id] = seq.generated_ids
        self.steps.append(out)
        return out

    def run(self, max_steps: int = 1000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_unfinished:
                break
            self.step()
        assert not self.sched.has_unfinished, "did not finish"
        assert self.bm.num_free_blocks == self.bm.num_blocks

    def _check(self, out: SchedulerOutput, was_running: set[str]) -> None:
        cfg = self.config
        ids = [c.seq.request_id for c in out.chunks]
        assert len(ids) == len(set(ids)) <= cfg.max_batch_size
        assert self.sched.num_running <= cfg.max_batch_size
        prefill = sum(c.length for c in out.chunks if not (c.length == 1 and c.sample))
        assert prefill <= cfg.max_batch_prefill_tokens
        admitted = [c for c in out.chunks if c.seq.request_id not in was_running]
        if admitted and cfg.max_batch_total_tokens is not None:
            running = [s for s in self.seqs.values() if s.status == SequenceStatus.RUNNING]
            assert sum(s.num_tokens for s in running) <= cfg.max_batch_total_tokens
        for c in out.chunks:
            assert c.seq.status == SequenceStatus.RUNNING and c.start == c.seq.num_computed_tokens
            assert len(c.seq.block_table) * BS >= c.start + c.length
        for victim in out.preempted:
            assert victim.status == SequenceStatus.PREEMPTED and not victim.block_table
            # The victim ranks below everything that kept its chunk.
            assert all((-c.seq.priority, c.seq.order) < (-victim.priority, victim.order) for c in out.chunks)

    def chunks(self, out: SchedulerOutput) -> dict[str, tuple[int, int]]:
        return {c.seq.request_id: (c.start, c.length) for c in out.chunks}


def test_long_prompt_is_chunked_while_others_keep_decoding() -> None:
    sim = Sim(max_batch_prefill_tokens=16)
    sim.add("a", 5, max_new=10)
    assert sim.chunks(sim.step()) == {"a": (0, 5)}
    b = sim.add("b", 40, max_new=2)
    assert sim.chunks(sim.step()) == {"a": (5, 1), "b": (0, 16)}  # a's decode is outside the budget
    assert sim.chunks(sim.step()) == {"a": (6, 1), "b": (16, 16)}
    out = sim.step()
    assert sim.chunks(out) == {"a": (7, 1), "b": (32, 8)}
    assert b.num_generated == 1  # its last chunk sampled
    sim.run()
    assert sim.outputs["b"] == reference(b.prompt_ids, 2)


def test_prefill_budget_is_shared_by_admissions() -> None:
    sim = Sim(max_batch_prefill_tokens=10)
    c = [sim.add(rid, 6) for rid in "abc"][-1]
    assert sim.chunks(sim.step()) == {"a": (0, 6), "b": (0, 4)}  # c waits: budget spent
    assert sim.chunks(sim.step()) == {"a": (6, 1), "b": (4, 2), "c": (0, 6)}
    sim.run()
    assert sim.outputs["c"] == reference(c.prompt_ids, 4)


def test_admission_by_priority_then_arrival() -> None:
    sim = Sim(max_batch_size=1)
    for rid, priority in [("low", 0), ("high", 5), ("high2", 5), ("mid", 1)]:
        sim.add(rid, 3, max_new=2, priority=priority)
    sim.run()
    first = []
    for out in sim.steps:
        first += [c.seq.request_id for c in out.chunks if c.seq.request_id not in first]
    assert first == ["high", "high2", "mid", "low"]


def first_chunks(sim: Sim) -> list[str]:
    """Request ids in the order their first chunk was scheduled."""
    first: list[str] = []
    for out in sim.steps:
        first += [c.seq.request_id for c in out.chunks if c.seq.request_id not in first]
    return first


def test_burst_admits_shortest_prefill_first() -> None:
    sim = Sim(max_batch_prefill_tokens=8)
    for rid, length in [("long", 12), ("mid", 6), ("short", 3), ("mid2", 6)]:
        sim.add(rid, length, max_new=2)
    out = sim.step()
    assert sim.chunks(out) == {"short": (0, 3), "mid": (0, 5)}  # the budget cut mid's prompt
    sim.run()
    assert first_chunks(sim) == ["short", "mid", "mid2", "long"]
    assert sim.outputs["long"] == reference(sim.seqs["long"].prompt_ids, 2)


def test_arrival_order_when_asked() -> None:
    sim = Sim(max_batch_prefill_tokens=8, admission_order="arrival")
    for rid, length in [("long", 12), ("mid", 6), ("short", 3)]:
        sim.add(rid, length, max_new=2)
    sim.run()
    assert first_chunks(sim) == ["long", "mid", "short"]


def test_unknown_admission_order_is_refused() -> None:
    with pytest.raises(ValueError, match="admission_order 'sjf': use one of shortest, arrival"):
        Sim(admission_order="sjf")


def test_long_prompt_is_passed_only_until_its_own_length_is_served() -> None:
    # A 20-token prompt and a 3-token newcomer every step, budget 3 prefill tokens a step. The
    # newcomers pass the long prompt (shortest first) only while fewer than its own 20 tokens of
    # prefill have been served since it arrived; then it goes first: it never starves.
    sim = Sim(max_batch_prefill_tokens=3, max_batch_size=64, num_blocks=256)
    sim.add("long", 20, max_new=1)
    served = 0  # prefill tokens scheduled before the long prompt's first chunk
    for k in range(40):
        sim.add(f"new{k}", 3, max_new=1)
        out = sim.step()
        if "long" in sim.chunks(out):
            break
        served += sum(c.length for c in out.chunks if c.start < c.seq.num_prompt_tokens)
    else:
        pytest.fail("the long prompt starved behind 40 short ones")
    assert 20 - 3 < served <= 20  # passed, but only until its own length was served
    sim.run()
    assert sim.outputs["long"] == reference(sim.seqs["long"].prompt_ids, 1)


def test_max_batch_size() -> None:
    sim = Sim(max_batch_size=3)
    for i in range(5):
        sim.add(f"r{i}", 4)
    assert set(sim.chunks(sim.step())) == {"r0", "r1", "r2"}
    assert sim.sched.num_running == 3 and sim.sched.num_waiting == 2
    assert sim.sched.capacity() == 0
    sim.run()
    assert len(sim.outputs) == 5


def test_max_batch_total_tokens_admits_in_strict_order() -> None:
    sim = Sim(max_batch_total_tokens=20, admission_order="arrival")
    sim.add("a", 12, max_new=2)
    sim.add("b", 12, max_new=2)
    sim.add("c", 4, max_new=2)  # would fit, but must not overtake b
    assert set(sim.chunks(sim.step())) == {"a"}
    assert set(sim.chunks(sim.step())) == {"a"}
    assert set(sim.chunks(sim.step())) == {"b", "c"}  # a finished
    sim.run()
    with pytest.raises(ValueError, match="more than the engine holds"):
        sim.add("huge", 19, max_new=2)


def test_prefix_hits_skip_compute_and_budget() -> None:
    sim = Sim(max_batch_prefill_tokens=4)
    shared = list(range(1, 13))
    sim.add("a", shared + [20], max_new=1)
    sim.run()
    b = sim.add("b", shared + [30, 31, 32], max_new=1)
    assert sim.chunks(sim.step()) == {"b": (12, 3)}
    assert b.num_cached_tokens == 12 and sim.bm.num_hit_tokens == 12
    sim.run()
    assert sim.outputs["b"] == reference(shared + [30, 31, 32], 1)


def test_preemption_picks_lowest_priority_then_newest() -> None:
    sim = Sim(num_blocks=6)
    a = sim.add("a", 7, max_new=6)
    b = sim.add("b", 7, max_new=6, priority=1)
    c = sim.add("c", 7, max_new=6, deadline=1.0)
    assert set(sim.chunks(sim.step())) == {"a", "b", "c"}  # 2 blocks each: the cache is full
    assert not sim.step().preempted  # position 7 still fits
    out = sim.step()  # position 8 needs a third block each
    assert out.preempted == [c] and c.status == SequenceStatus.PREEMPTED
    assert set(sim.chunks(out)) == {"a", "b"} and sim.sched.num_preemptions == 1
    sim.now[0] = 100.0  # past c's deadline: a started request does not expire
    sim.run()
    assert not any(step.expired for step in sim.steps)
    assert sim.outputs == {
        "a": reference(a.prompt_ids, 6),
        "b": reference(b.prompt_ids, 6),
        "c": reference(c.prompt_ids, 6),
    }


def test_priority_outranks_arrival_for_preemption() -> None:
    sim = Sim(num_blocks=4)
    a = sim.add("a", 7, max_new=3)
    sim.add("b", 7, max_new=3, priority=1)  # newer, but more important
    sim.step()
    sim.step()
    out = sim.step()
    assert out.preempted == [a] and set(sim.chunks(out)) == {"b"}
    sim.run()
    assert sim.outputs["a"] == reference(a.prompt_ids, 3)


def test_sequence_preempts_itself_when_it_ranks_last_and_resumes_first() -> None:
    sim = Sim(num_blocks=3, max_batch_size=2, admission_order="arrival")  # d is shorter than c
    sim.add("a", 3, max_new=9, priority=1)
    b = sim.add("b", 4, max_new=1)
    sim.step()
    assert sim.chunks(sim.step()) == {"a": (3, 1)}  # b finished, its block is free
    c = sim.add("c", 4, max_new=4)
    d = sim.add("d", 2, max_new=1)
    assert set(sim.chunks(sim.step())) == {"a", "c"}  # d waits for a batch slot
    out = sim.step()  # c needs a second block while a holds two: c is the one to wait
    assert out.preempted == [c] and set(sim.chunks(out)) == {"a"}
    assert [s.request_id for s in sim.sched._waiting] == ["c", "d"]  # c keeps its place
    sim.run()
    admitted = [ch.seq.request_id for o in sim.steps[4:] for ch in o.chunks if ch.seq.request_id != "a"]
    assert list(dict.fromkeys(admitted)) == ["c", "d"], "d overtook the preempted c"
    assert sim.outputs["c"] == reference(c.prompt_ids, 4) and sim.outputs["b"] == reference(b.prompt_ids, 1)
    assert sim.outputs["d"] == reference(d.prompt_ids, 1)


def test_waiting_requests_expire() -> None:
    sim = Sim(max_batch_size=1)
    running = sim.add("running", 3, max_new=5, deadline=10.0)
    late = sim.add("late", 3, deadline=10.0)
    patient = sim.add("patient", 3, deadline=1000.0)
    sim.step()
    sim.now[0] = 50.0
    out = sim.step()
    assert out.expired == [late] and late.status == SequenceStatus.FINISHED
    assert late.finish_reason == FinishReason.EXPIRED and not late.block_table
    assert sim.sched.get("late") is None and sim.sched.num_waiting == 1
    assert running.status == SequenceStatus.RUNNING and "late" not in sim.chunks(out)
    sim.run()
    assert set(sim.outputs) == {"running", "patient"} and patient.num_generated == 4


def test_abort_waiting_and_running() -> None:
    sim = Sim(num_blocks=16, max_batch_size=1)
    sim.add("a", 9)
    sim.add("b", 9)
    sim.step()
    assert sim.bm.num_used_blocks == 3
    [a] = sim.sched.abort("a")
    assert a.status == SequenceStatus.FINISHED and not a.block_table
    assert a.finish_reason == FinishReason.ABORTED
    assert sim.bm.num_used_blocks == 0 and sim.sched.num_running == 0
    [b] = sim.sched.abort("b")
    assert b.status == SequenceStatus.FINISHED and sim.sched.num_waiting == 0
    assert b.finish_reason == FinishReason.ABORTED
    assert sim.sched.abort("b") == [] and not sim.sched.has_unfinished
    # Aborted between schedule() and complete(): the chunk is dropped.
    c = sim.add("c", 5)
    out = sim.sched.schedule()
    sim.sched.abort("c")
    sim.sched.complete(out)
    assert c.num_computed_tokens == 0 and sim.bm.num_free_blocks == sim.bm.num_blocks


def test_capacity() -> None:
    sim = Sim(num_blocks=20, max_batch_size=8)
    assert sim.sched.capacity() == 8  # idle: batch slots
    sim.add("a", 8, max_new=20)
    sim.add("b", 8, max_new=20)
    # 6 slots; free blocks 20 - 4 queued = 16, at 2 blocks per request (the mean length)
    assert sim.sched.capacity() == 6
    sim.step()
    assert sim.sched.capacity() == 5  # 16 free blocks, 3 per request now that both hold 9 tokens
    for i in range(6):
        sim.add(f"r{i}", 16)
    sim.step()  # blocks run out before everything is admitted
    assert sim.sched.num_waiting > 0 and sim.sched.capacity() == 0
    sim.run()
    assert sim.sched.capacity() == 8


def test_capacity_fills_the_next_steps_prefill_budget_while_requests_wait() -> None:
    # The worker asks while a step runs, after schedule() and before complete(): the step's own
    # chunks are not backlog any more.
    sim = Sim(max_batch_prefill_tokens=32, max_batch_size=16, admission_order="arrival")
    mid_step: list[int] = []
    complete = sim.sched.complete
    sim.sched.complete = lambda out: (mid_step.append(sim.sched.capacity()), complete(out))[1]  # type: ignore[method-assign]
    for i in range(5):
        sim.add(f"r{i}", 12)
    sim.step()  # r0, r1 and 8 of r2's 12 tokens: 4 + r3 + r4 = 28 left
    assert sim.sched.num_waiting == 2
    assert mid_step == [1]  # 32 - 28 = 4 tokens: one more 12-token request
    assert sim.sched.capacity() == 1
    sim.add("r5", 12)  # what the worker read: it joins the next step
    sim.step()
    assert [c.seq.request_id for c in sim.steps[-1].chunks if c.length > 1] == ["r2", "r3", "r4", "r5"]
    for i in range(6, 12):
        sim.add(f"r{i}", 12)
    sim.step()  # 72 tokens waited, 32 taken: 40 still ahead, more than a step's budget
    assert sim.sched.capacity() == 0
    sim.run()
    assert len(sim.outputs) == 12


def test_add_rejects_duplicates_and_oversized() -> None:
    sim = Sim(num_blocks=4)
    sim.add("a", 3)
    with pytest.raises(ValueError, match="already"):
        sim.add("a", 3)
    with pytest.raises(ValueError, match="more than the engine holds"):
        sim.add("big", 14, max_new=3)  # 17 tokens > 4 blocks of 4
    # The engine ends a sequence at max_model_len: only that much has to fit.
    sim.sched.max_model_len = 16
    sim.add("capped", 14, max_new=100)
    with pytest.raises(ValueError, match="more than the engine holds"):
        sim.add("long_prompt", 17, max_new=1)


@settings(max_examples=40, deadline=None)
@given(
    num_blocks=st.integers(6, 24),
    budget=st.integers(4, 24),
    max_batch_size=st.integers(1, 6),
    total=st.none() | st.integers(16, 48),
    requests=st.lists(
        st.tuples(
            st.sampled_from([[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8]]),
            st.lists(st.integers(0, 9), min_size=1, max_size=8),
            st.integers(1, 6),  # max_new
            st.integers(0, 2),  # priority
            st.integers(0, 3),  # arrival step
        ),
        min_size=1,
        max_size=10,
    ),
)
def test_random_workloads_finish_with_reference_outputs(
    num_blocks: int,
    budget: int,
    max_batch_size: int,
    total: int | None,
    requests: list[tuple[list[int], list[int], int, int, int]],
) -> None:
    sim = Sim(num_blocks, max_batch_prefill_tokens=budget, max_batch_size=max_batch_size)
    sim.config.max_batch_total_tokens = total
    expected = {}
    for step in range(4):
        for i, (base, tail, max_new, priority, arrival) in enumerate(requests):
            if arrival == step and len(base + tail) + max_new <= sim.sched.max_seq_len:
                sim.add(f"r{i}", base + tail, max_new=max_new, priority=priority)
                expected[f"r{i}"] = reference(base + tail, max_new)
        sim.step()
    sim.run()
    assert sim.outputs == expected


def test_prefill_backlog_counts_the_prompt_tokens_not_yet_prefilled() -> None:
    sim = Sim(max_batch_prefill_tokens=8, admission_order="arrival")
    sim.add("a", 20)
    sim.add("b", 6)
    assert sim.sched.prefill_backlog == 26  # both waiting, whole prompts
    sim.step()  # 8 of a's prompt
    assert sim.sched.prefill_backlog == 18
    while sim.sched.prefill_backlog:
        sim.step()
    # everything prefilled: decoding rows (one next token each) are not prefill
    assert sim.sched.num_running == 2 and all(s.num_uncomputed == 1 for s in sim.seqs.values())
    sim.run()
    assert sim.sched.prefill_backlog == 0
    # a prompt whose first blocks the cache holds (a's 20 tokens: 4 full blocks of 4 within the
    # first 19) counts only the rest
    again = sim.add("c", list(sim.seqs["a"].prompt_ids))
    assert again.expected_hit_tokens == 16 and sim.sched.prefill_backlog == 20 - 16
