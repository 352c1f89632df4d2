"""Speculative decoding by prompt lookup: the proposer's matching, the block manager's rollback, and
the engine's output with speculation on equal to it off, event for event (greedy, CPU fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.engine.block_manager import BlockManager
from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.events import TokenEvent
from conveyor.engine.params import SamplingParams, StoppingParams
from conveyor.engine.sequence import Sequence
from conveyor.engine.speculative.ngram import NgramProposer
from conveyor.engine.speculative.policy import DraftState

PROMPT = list(range(100, 137))
NEW = 40


def test_proposer_takes_the_longest_ngram_and_its_latest_occurrence() -> None:
    p = NgramProposer(1, 3)
    # "1 2 3" occurs once before the suffix; "3" alone more recently: the 3-gram wins.
    assert p.propose([1, 2, 3, 9, 9, 3, 7, 1, 2, 3], 2) == [9, 9]
    assert p.propose([5, 1, 6, 1, 7, 1], 3) == [7, 1]  # latest "1": what followed it, up to the end
    assert p.propose([1, 2, 3, 4], 3) == []  # no earlier occurrence
    assert p.propose([4, 4], 0) == []
    assert NgramProposer(2, 2).propose([8, 1, 2, 8, 3, 1, 2], 5) == [8, 3, 1, 2]
    with pytest.raises(ValueError):
        NgramProposer(3, 2)


def test_draft_blocks_never_evict_the_prefix_cache_and_are_given_back() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    cached = Sequence("c", list(range(9)))
    assert bm.allocate(cached, 9)
    cached.num_computed_tokens = 9
    bm.cache_blocks(cached)
    bm.free(cached)  # two hashed free blocks at the back, four unhashed at the front
    seq = Sequence("s", list(range(50, 55)))
    assert bm.allocate(seq, 5)
    seq.num_computed_tokens = 4  # token 4 is the next to compute, in block 1
    free, hashes = bm.num_free_blocks, set(bm.cached_hashes(100))
    # Room for positions 5..7 in its block, then the two unhashed free blocks: 3 + 8, not more.
    assert bm.extend_for_draft(seq, 20) == 11
    assert set(bm.cached_hashes(100)) == hashes
    seq.num_computed_tokens = 6  # the next token and one draft token were accepted
    bm.truncate(seq)
    assert len(seq.block_table) == 2 and bm.num_free_blocks == free
    assert set(bm.cached_hashes(100)) == hashes


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> dict[int, Engine]:
    def make(k: int) -> Engine:
        return Engine.from_pretrained(tiny_model_dir, EngineConfig(
            num_blocks=128, block_size=16, device="cpu", dtype="float32", speculate=k))
    return {0: make(0), 4: make(4)}


def run(engine: Engine, requests: dict[str, tuple[list[int], dict[str, object]]]) -> list[TokenEvent]:
    for rid, (prompt, kw) in requests.items():
        engine.add(rid, prompt, **kw)  # type: ignore[arg-type]
    events: list[TokenEvent] = []
    steps = 0
    while engine.has_unfinished():
        events += engine.step()
        steps += 1
        assert steps < 1000
    return events


def by_request(events: list[TokenEvent]) -> dict[str, list[tuple[object, ...]]]:
    out: dict[str, list[tuple[object, ...]]] = {}
    for e in events:
        out.setdefault(e.request_id, []).append(
            (e.index, e.token_id, e.text, e.logprob, e.top_tokens, e.finish_reason, e.generated_text))
    return out


def tokens_of(events: list[TokenEvent]) -> dict[str, list[int | None]]:
    out: dict[str, list[int | None]] = {}
    for e in events:
        out.setdefault(e.request_id, []).append(e.token_id)
    return out


def both(engines: dict[int, Engine], requests: dict[str, tuple[list[int], dict[str, object]]]):  # type: ignore[no-untyped-def]
    """Runs `requests` with speculation off and on from an empty prefix cache; checks every block
    is free after each run and the cached hashes match. Returns the events of both."""
    results = []
    for engine in engines.values():
        bm = engine.block_manager
        assert bm.reset_prefix_cache()
        events = run(engine, requests)
        assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)
        results.append((by_request(events), set(bm.cached_hashes(10**6))))
    (off, off_hashes), (on, on_hashes) = results
    assert on_hashes == off_hashes
    return off, on


def greedy_tokens(engine: Engine, prompt: list[int], n: int = NEW) -> list[int]:
    events = run(engine, {"g": (prompt, {"stopping": StoppingParams(max_new_tokens=n, ignore_eos=True)})})
    return [e.token_id for e in events if e.token_id is not None]


def copy_prompt(engines: dict[int, Engine]) -> list[int]:
    """PROMPT, its greedy continuation, PROMPT again: what follows is likely that continuation,
    and the lookup proposes it."""
    return PROMPT + greedy_tokens(engines[0], PROMPT) + PROMPT


def test_greedy_output_is_identical_with_speculation_alone_and_in_a_mixed_batch(engines) -> None:  # type: ignore[no-untyped-def]
    stop = StoppingParams(max_new_tokens=NEW, ignore_eos=True)
    copy = copy_prompt(engines)
    before = engines[4].speculator.stats.num_accepted_tokens
    off, on = both(engines, {"copy": (copy, {"stopping": stop})})
    assert on == off
    assert engines[4].speculator.stats.num_accepted_tokens > before  # the draft was used
    load = engines[4].stats()
    assert 0 < load.spec_accepted_tokens <= load.spec_draft_tokens and load.spec_drafts > 0
    assert engines[0].stats().spec_drafts == 0

    requests = {
        "copy": (copy, {"stopping": stop}),
        "plain": (PROMPT, {"stopping": stop}),
        "top": (copy[:60], {"stopping": stop, "sampling": SamplingParams(top_n_tokens=3)}),
        "biased": (copy, {"stopping": stop, "sampling": SamplingParams(logit_bias=((PROMPT[3], 2.0),))}),
        # Speculates too, drawing as a step at a time would (test_speculative_sampling.py).
        "sampled": (copy, {"stopping": stop, "sampling": SamplingParams(do_sample=True, seed=7)}),
        "penalty": (copy, {"stopping": stop, "sampling": SamplingParams(repetition_penalty=1.3)}),
        "two": (copy[:50], {"stopping": stop, "n": 2}),
        "short": (copy, {"stopping": StoppingParams(max_new_tokens=3, ignore_eos=True)}),
    }
    off, on = both(engines, requests)
    assert on == off
    assert all(len(off[rid]) == 3 for rid in ("short",))


def test_a_stop_sequence_inside_an_accepted_draft_cuts_exactly(engines) -> None:  # type: ignore[no-untyped-def]
    copy = copy_prompt(engines)
    tokens = greedy_tokens(engines[0], copy)
    text = engines[0].tokenizer.decode(tokens[12:14])
    stop = StoppingParams(max_new_tokens=NEW, ignore_eos=True, stop=(text,))
    off, on = both(engines, {"s": (copy, {"stopping": stop})})
    assert on == off
    assert off["s"][-1][5] == "stop_sequence" and len(off["s"]) < NEW


def test_chunked_prefill_and_preemption_keep_the_output(tiny_model_dir: Path) -> None:
    def make(k: int, num_blocks: int) -> Engine:
        return Engine.from_pretrained(tiny_model_dir, EngineConfig(
            num_blocks=num_blocks, block_size=16, device="cpu", dtype="float32", speculate=k,
            max_batch_prefill_tokens=48))
    ref = make(0, 128)
    copy = PROMPT + greedy_tokens(ref, PROMPT) + PROMPT
    stop = StoppingParams(max_new_tokens=NEW, ignore_eos=True)
    requests = {f"r{i}": (copy[i:], {"stopping": stop}) for i in range(3)}
    expected = tokens_of(run(ref, requests))
    small = make(4, 24)  # three sequences of ~160 tokens in 24 blocks of 16: preemptions
    before = small.speculator.stats.num_accepted_tokens
    # Tokens, not logprobs: a preempted sequence's context is recomputed by the prefill kernel,
    # whose logprobs differ from the decode kernel's in the last ulp, with speculation or without.
    assert tokens_of(run(small, requests)) == expected
    assert small.speculator.stats.num_accepted_tokens > before
    assert small.scheduler.num_preemptions > 0
    assert small.block_manager.num_free_blocks == small.block_manager.num_blocks


def test_who_gets_a_draft_and_how_its_length_adapts() -> None:
    import torch

    from conveyor.engine.sampler import Sampler
    from conveyor.engine.speculative.verify import Speculator
    from conveyor.engine.step_plan import ScheduledChunk, SchedulerOutput

    bm = BlockManager(num_blocks=256, block_size=4)
    spec = Speculator(4, bm)

    def decoding(rid: str, sampling: SamplingParams | None = None) -> ScheduledChunk:
        seq = Sequence(rid, [1, 2, 3, 1, 2, 3, 1, 2], sampling or SamplingParams(),
                       StoppingParams(max_new_tokens=50))
        seq.append_token(3)  # one generated token: "1 2 3" repeats, the lookup proposes "1 2 3"
        assert bm.allocate(seq, seq.num_tokens)
        seq.num_computed_tokens = seq.num_tokens - 1
        return ScheduledChunk(seq, seq.num_computed_tokens, 1)

    greedy, penalised = decoding("g"), decoding("p", SamplingParams(repetition_penalty=1.2))
    refused = decoding("off", SamplingParams(speculate=False))
    assert spec.propose(SchedulerOutput([greedy, penalised, refused])) == [greedy]
    assert greedy.draft == [1, 2, 3] and not penalised.draft and not refused.draft
    greedy.seq.num_computed_tokens += 1  # what the scheduler's complete() does after the forward
    # The model agrees with the first two draft tokens only: 2 accepted + the bonus token, and the
    # next draft is one shorter.
    logits = torch.full((4, 16), -5.0)
    logits[torch.arange(4), torch.tensor([1, 2, 7, 9])] = 5.0
    emitted: list[int] = []

    def emit(seq: Sequence, token: int, logprob: float, top: object) -> TokenEvent:
        emitted.append(token)
        return TokenEvent(request_id=seq.request_id, choice=0, index=0, token_id=token, text="")

    spec.verify([greedy], logits, Sampler(), emit)
    assert emitted == [1, 2, 7] and greedy.seq.generated_ids == [3, 1, 2, 7]
    assert greedy.seq.num_computed_tokens == 11 and greedy.seq.drafting.limit == 3
    assert len(greedy.seq.block_table) == bm.blocks_for(11)
    assert (spec.stats.num_draft_tokens, spec.stats.num_accepted_tokens) == (3, 2)
    # A batch as large as the row budget gets no draft at all; a smaller one shares what is left,
    # the sequences with the longest drafts allowed first.
    many = [decoding(f"m{i}") for i in range(spec.row_budget)]
    assert spec.propose(SchedulerOutput(many)) == [] and not any(c.draft for c in many)
    # A paused sequence gets no draft beside others, and one alone in its step (its rows are free).
    paused = [decoding("p0"), decoding("p1")]
    for chunk in paused:
        chunk.seq.drafting = DraftState(limit=2, pause=3)
    assert spec.propose(SchedulerOutput(paused)) == []
    assert spec.propose(SchedulerOutput(paused[:1])) == paused[:1] and len(paused[0].draft) == 2
    some = [decoding(f"s{i}") for i in range(spec.row_budget - 5)]
    some[0].seq.drafting = DraftState(limit=1)  # its last drafts missed: served last
    assert spec.propose(SchedulerOutput(some)) == [some[1], some[2]]
    assert [len(c.draft) for c in some[:4]] == [0, 3, 2, 0]  # 5 rows left; the lookup finds 3 tokens
