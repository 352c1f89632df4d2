"""Speculative decoding's policy (conveyor/engine/speculative/policy.py): draft lengths adapted per
sequence, pauses after misses, the step's rows shared out. Pure logic, no model."""

from __future__ import annotations

from conveyor.engine.speculative.policy import MAX_PAUSE, MIN_ACCEPTANCE, DraftState, share_rows


def test_draft_length_grows_when_taken_whole_and_shrinks_on_a_miss() -> None:
    state = DraftState(limit=4)
    state.update(proposed=4, accepted=4, most=6)
    assert state.limit == 6
    state.update(proposed=6, accepted=6, most=6)
    assert state.limit == 6  # never past the setting
    state.update(proposed=6, accepted=2, most=6)
    assert state.limit == 5 and state.pause == 0  # a partial miss shortens, never pauses
    state.update(proposed=3, accepted=3, most=6)  # the lookup found only 3 tokens: all taken
    assert state.limit == 6


def test_low_acceptance_pauses_the_drafts_longer_each_time_until_it_recovers() -> None:
    state = DraftState(limit=1)
    pauses = []
    for _ in range(9):
        state.update(proposed=1, accepted=0, most=4)
        pauses.append(state.pause)
        skipped = 0
        while not state.ready():
            skipped += 1
        assert skipped == pauses[-1]  # each paused decode is counted down once
    # From a half, under MIN_ACCEPTANCE at once: pauses doubling, capped.
    assert pauses == [1, 2, 4, 8, 16, MAX_PAUSE, MAX_PAUSE, MAX_PAUSE, MAX_PAUSE]
    state.update(proposed=1, accepted=1, most=4)  # one accepted token: the average is still low
    assert state.acceptance < MIN_ACCEPTANCE and state.pause == MAX_PAUSE and state.limit == 3
    while not state.ready():
        pass
    state.update(proposed=3, accepted=3, most=4)  # back over the threshold: no pause, doubling reset
    assert state.acceptance >= MIN_ACCEPTANCE and state.pause == 0 and state.last_pause == 0


def test_rows_go_to_the_longest_drafts_first_within_the_budget() -> None:
    assert share_rows([4, 1, 4, 2], budget=7) == [4, 0, 3, 0]
    assert share_rows([4, 1, 4, 2], budget=20) == [4, 1, 4, 2]
    assert share_rows([2, 2], budget=3) == [2, 1]  # ties in order
    assert share_rows([3], budget=0) == [0]
