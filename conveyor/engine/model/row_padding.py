"""How many rows a CPU step's GEMMs are given (Llama.min_rows): steps with fewer rows are padded.

At least the fewest rows from which every row's result is the same bits whatever the row count
(linear.exact_min_rows), so that a sequence's logits never depend on its batch. Above that count the
bits are the same for any count up to the one it was checked against, so padding further changes
only the speed, and a GEMM library's speed at a few rows is not monotone: oneDNN here ran a step's
GEMMs faster at 5 rows than at 1-2 (docs/engine.md, "Small steps padded", has the figures). So the
count is chosen at load by timing the model's own GEMMs at each count from the exact one up to a
few above it.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from conveyor.engine.model.linear import Linear

logger = logging.getLogger(__name__)

MOST_TRIED = 8  # counts above this are not tried: a step of 8 rows costs about what 1 does here
ROUNDS = 5  # timings per count, the counts interleaved in each round
MARGIN = 0.95  # another count replaces the exact one only when its median is under 95 % of it


def fastest(run: Callable[[int], object], counts: Sequence[int], rounds: int = ROUNDS, margin: float = MARGIN,
            clock: Callable[[], float] = time.perf_counter) -> tuple[int, dict[int, float]]:
    """The count whose `run(count)` has the lowest median time, and each count's median (seconds).

    The counts take turns in every round, so the machine's drift during the timing falls on all of
    them alike; one untimed call each first (caches, lazily built kernels). The first count is kept
    unless another's median is under `margin` times its own: a choice that noise could flip is not
    worth a change.
    """
    for count in counts:
        run(count)
    times: dict[int, list[float]] = {count: [] for count in counts}
    for _ in range(rounds):
        for count in counts:
            start = clock()
            run(count)
            times[count].append(clock() - start)
    medians = {count: statistics.median(ts) for count, ts in times.items()}
    best = min(counts, key=medians.__getitem__)
    return (best if medians[best] < margin * medians[counts[0]] else counts[0]), medians


def padded_rows(linears: Sequence[Linear], exact: int, checked: int) -> int:
    """The rows a step's GEMMs are padded to: the fastest count from `exact` (the fewest rows whose
    results are exact) to MOST_TRIED, never above `checked` (the count exactness was checked
    against), timed on these linears, each called as in a step."""
    counts = list(range(exact, min(MOST_TRIED, checked) + 1))
    if len(counts) < 2:
        return exact
    g = torch.Generator().manual_seed(0)
    widths = sorted({linear.in_features for linear in linears})
    inputs = {m: {k: torch.randn(m, k, generator=g) for k in widths} for m in counts}

    def step(m: int) -> None:
        for linear in linears:
            linear(inputs[m][linear.in_features])

    with torch.inference_mode():
        rows, medians = fastest(step, counts)
    if rows != exact:
        logger.info("a step's GEMMs are padded to %d rows: %.1f ms there against %.1f ms at %d, the "
                    "fewest exact rows (timed at load, %d-%d rows)", rows, 1e3 * medians[rows],
                    1e3 * medians[exact], exact, counts[0], counts[-1])
    return rows
