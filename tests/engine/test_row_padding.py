"""conveyor.engine.model.row_padding: a step's GEMMs are padded to the fastest row count from the exact
one."""

from __future__ import annotations

import pytest
import torch

from conveyor.engine.model import row_padding
from conveyor.engine.model.linear import Linear, exact_min_rows
from conveyor.engine.model.row_padding import fastest, padded_rows


class _FakeTimedRun:
    """run(count) takes cost[count] seconds on a fake clock, so the timings are exact."""

    def __init__(self, cost: dict[int, float]) -> None:
        self.cost, self.now, self.calls = cost, 0.0, 0

    def clock(self) -> float:
        return self.now

    def __call__(self, count: int) -> None:
        self.now += self.cost[count]
        self.calls += 1


def test_the_fastest_count_is_chosen() -> None:
    run = _FakeTimedRun({2: 0.040, 3: 0.036, 4: 0.035, 5: 0.030, 6: 0.031})
    rows, medians = fastest(run, [2, 3, 4, 5, 6], rounds=3, clock=run.clock)
    assert rows == 5
    assert medians == pytest.approx(run.cost)
    assert run.calls == 5 * (3 + 1)  # one untimed call per count, then the rounds


def test_the_exact_count_stays_unless_another_beats_it_by_the_margin() -> None:
    run = _FakeTimedRun({2: 0.040, 3: 0.039, 4: 0.041})  # 2.5 % faster: within the margin
    assert fastest(run, [2, 3, 4], clock=run.clock)[0] == 2
    run = _FakeTimedRun({1: 0.010, 2: 0.012})  # the first is the fastest
    assert fastest(run, [1, 2], clock=run.clock)[0] == 1


def test_the_median_is_what_counts_not_one_slow_round() -> None:
    times = iter([0.000, 0.040, 0.040, 0.070,  # round 1 (start, end per count): 2 took 0.040, 4 0.030
                  0.070, 0.370, 0.370, 0.400,  # round 2: 2 took 0.300 (the machine stalled), 4 0.030
                  0.400, 0.440, 0.440, 0.470])  # round 3: 2 took 0.040, 4 0.030 (warm-ups are not timed)
    rows, medians = fastest(lambda _: None, [2, 4], rounds=3, clock=lambda: next(times))
    assert rows == 4
    assert medians[2] == pytest.approx(0.040)


def test_padding_stays_between_the_exact_count_and_the_checked_one(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = Linear(torch.randn(48, 32) * 0.1)
    timed: list[list[int]] = []
    real = row_padding.fastest

    def spy(run, counts, *args, **kwargs):  # type: ignore[no-untyped-def]
        timed.append(list(counts))
        return real(run, counts, *args, **kwargs)

    monkeypatch.setattr(row_padding, "fastest", spy)
    rows = padded_rows([layer], 2, 16)
    assert timed == [list(range(2, row_padding.MOST_TRIED + 1))]
    assert 2 <= rows <= row_padding.MOST_TRIED
    assert padded_rows([layer], 3, 4) in (3, 4)
    assert timed[-1] == [3, 4]
    assert padded_rows([layer], 16, 16) == 16  # nothing to choose: no timing
    assert padded_rows([layer], row_padding.MOST_TRIED, 16) == row_padding.MOST_TRIED
    assert len(timed) == 2


def test_any_padding_from_the_exact_count_gives_the_same_bits() -> None:
    # Why the choice is free: every count from the exact one up gives each row the same result.
    g = torch.Generator().manual_seed(1)
    layer = Linear(torch.randn(576, 1536, generator=g) * 0.05)  # SmolLM2's down projection's shape
    exact = exact_min_rows([layer], 16)
    x = torch.randn(1, 1536, generator=g)
    alone = layer(torch.cat([x, torch.zeros(exact - 1, 1536)]))[0]
    for rows in range(exact, 17):
        assert torch.equal(layer(torch.cat([x, torch.zeros(rows - 1, 1536)]))[0], alone), rows
