"""n sequences of one request (OpenAI `n`, TGI `best_of`): the prompt is computed once and its KV
blocks shared; the forks copy a shared partial block before writing it; every block is free again
once the request ends, however it ends (finish, abort, preemption); seeds per choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.engine.block_manager import BlockManager
from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.events import TokenEvent
from conveyor.engine.fork import choice_seed
from conveyor.engine.params import SamplingParams, StoppingParams
from conveyor.engine.sequence import Sequence

PROMPT = list(range(100, 137))  # 37 tokens: two full blocks of 16 and a partial one
STOP = StoppingParams(max_new_tokens=12, ignore_eos=True)
SAMPLED = SamplingParams(do_sample=True, temperature=1.0, seed=1234)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    return Engine.from_pretrained(tiny_model_dir, EngineConfig(num_blocks=64, block_size=16, device="cpu",
                                                              dtype="float32"))


def run(engine: Engine, *, max_steps: int = 500) -> list[TokenEvent]:
    events: list[TokenEvent] = []
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        events += engine.step()
    return events


def by_choice(events: list[TokenEvent], rid: str = "r") -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for e in events:
        if e.request_id == rid and e.token_id is not None:
            out.setdefault(e.choice, []).append(e.token_id)
    return out


def check_free(engine: Engine, start: int) -> None:
    assert not engine.has_unfinished()
    assert engine.block_manager.num_free_blocks == start
    assert all(b.ref_count == 0 for b in engine.block_manager.blocks)


def test_greedy_choices_are_identical_and_equal_a_plain_request(engine: Engine) -> None:
    start = engine.block_manager.num_free_blocks
    engine.add("plain", PROMPT, stopping=STOP)
    plain = by_choice(run(engine), "plain")[0]
    engine.block_manager.reset_prefix_cache()
    engine.add("r", PROMPT, stopping=STOP, n=2)
    events = run(engine)
    tokens = by_choice(events)
    assert tokens == {0: plain, 1: plain}
    finals = [e for e in events if e.finish_reason is not None]
    assert sorted(e.choice for e in finals) == [0, 1]
    assert [e.index for e in events if e.choice == 1 and e.token_id is not None] == list(range(12))
    check_free(engine, start)


def test_forks_share_the_prompt_blocks(engine: Engine) -> None:
    """After the first decode step, n=3 holds the 2 shared full blocks plus one own partial block
    each (the copies), where three separate requests hold 3 blocks each."""
    engine.block_manager.reset_prefix_cache()
    start = engine.block_manager.num_free_blocks
    engine.add("r", PROMPT, sampling=SAMPLED, stopping=STOP, n=3)
    engine.step()  # prefill + the first token of all three
    engine.step()  # first decode: the forks copy the partial block they write into
    used_shared = start - engine.block_manager.num_free_blocks
    engine.abort("r")
    check_free(engine, start)
    engine.block_manager.reset_prefix_cache()
    for i in range(3):  # admitted together: none finds another's blocks in the prefix cache
        engine.add(f"s{i}", PROMPT, sampling=SAMPLED, stopping=STOP)
    engine.step()
    engine.step()
    used_separate = start - engine.block_manager.num_free_blocks
    for i in range(3):
        engine.abort(f"s{i}")
    check_free(engine, start)
    assert used_shared == 2 + 3
    assert used_separate == 9
    assert used_shared < used_separate


def test_sampled_choices_are_reproducible_and_choice_0_is_the_plain_request(engine: Engine) -> None:
    start = engine.block_manager.num_free_blocks
    engine.add("r", PROMPT, sampling=SAMPLED, stopping=STOP, n=3)
    first = run(engine)
    engine.add("r", PROMPT, sampling=SAMPLED, stopping=STOP, n=3)
    again = run(engine)
    engine.add("plain", PROMPT, sampling=SAMPLED, stopping=STOP)
    plain = by_choice(run(engine), "plain")[0]
    tokens = by_choice(first)
    assert tokens == by_choice(again)
    assert tokens[0] == plain
    assert len({tuple(t) for t in tokens.values()}) == 3  # each choice draws its own tokens
    seeds = {e.choice: e.seed for e in first if e.finish_reason is not None}
    assert seeds == {i: choice_seed(1234, i) for i in range(3)} and seeds[0] == 1234
    check_free(engine, start)


def test_resumed_choices_continue_exactly(engine: Engine) -> None:
    engine.add("r", PROMPT, sampling=SAMPLED, stopping=STOP, n=3)
    full = by_choice(run(engine))
    start = engine.block_manager.num_free_blocks
    # Choice 0 had finished, choice 1 had 5 tokens, choice 2 none.
    engine.add("r", PROMPT, sampling=SAMPLED, stopping=STOP, resumed={1: full[1][:5], 2: []})
    events = run(engine)
    tokens = by_choice(events)
    assert tokens == {1: full[1][5:], 2: full[2]}
    assert [e.index for e in events if e.choice == 1 and e.token_id is not None] == list(range(5, 12))
    check_free(engine, start)


def test_abort_before_and_after_the_fork_frees_everything(engine: Engine) -> None:
    start = engine.block_manager.num_free_blocks
    engine.add("r", PROMPT, sampling=SAMPLED, stopping=STOP, n=3)
    ended = engine.abort("r")  # still waiting: its forks end too
    assert sorted(e.choice for e in ended) == [0, 1, 2]
    assert all(e.finish_reason is not None and e.finish_reason.value == "aborted" for e in ended)
    check_free(engine, start)
    engine.add("r", PROMPT, sampling=SAMPLED, stopping=STOP, n=3)
    for _ in range(4):
        engine.step()
    ended = engine.abort("r")
    assert sorted(e.choice for e in ended) == [0, 1, 2] and all(e.index == 4 for e in ended)
    assert engine.abort("r") == []
    check_free(engine, start)


def test_preemption_of_forks_frees_and_recomputes(tiny_model_dir: Path) -> None:
    """4 blocks for 3 choices of 37 + 12 tokens (2 shared + 1 own each): they preempt one another, and
    still give what a roomy engine gives, and every block is free at the end."""
    roomy = Engine.from_pretrained(tiny_model_dir, EngineConfig(num_blocks=64, device="cpu", dtype="float32"))
    roomy.add("r", PROMPT, sampling=SAMPLED, stopping=STOP, n=3)
    expected = by_choice(run(roomy))
    tight = Engine.from_pretrained(tiny_model_dir, EngineConfig(num_blocks=4, device="cpu", dtype="float32"))
    tight.add("r", PROMPT, sampling=SAMPLED, stopping=STOP, n=3)
    events = run(tight, max_steps=2000)
    assert tight.scheduler.num_preemptions > 0
    assert by_choice(events) == expected
    check_free(tight, 4)


def test_copy_on_write_in_the_block_manager() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = Sequence("r", list(range(6)))  # one full block, one partial
    assert bm.allocate(parent, 6)
    parent.num_computed_tokens = 6
    child = Sequence("r", list(range(6)), choice=1)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert [bm.blocks[b].ref_count for b in parent.block_table] == [2, 2]
    assert bm.allocate(child, 1)  # writes position 6: into the shared partial block
    assert child.block_table[0] == parent.block_table[0] and child.block_table[1] != parent.block_table[1]
    assert bm.take_copies() == [(parent.block_table[1], child.block_table[1])]
    assert bm.take_copies() == []
    assert bm.allocate(parent, 1)  # the partial block is its own again: no copy
    assert bm.take_copies() == []
    bm.free(parent)
    assert bm.blocks[child.block_table[0]].ref_count == 1
    bm.free(child)
    assert bm.num_free_blocks == 8


def test_more_sequences_than_a_batch_holds_are_refused(tiny_model_dir: Path) -> None:
    small = Engine.from_pretrained(tiny_model_dir, EngineConfig(num_blocks=16, max_batch_size=2, device="cpu",
                                                               dtype="float32"))
    with pytest.raises(ValueError, match="3 sequences, more than a batch holds"):
        small.add("r", PROMPT, sampling=SAMPLED, stopping=STOP, n=3)
    assert not small.has_unfinished()
    small.add("r", PROMPT, sampling=SAMPLED, stopping=STOP, n=2)  # two fit
    assert sorted(by_choice(run(small))) == [0, 1]
