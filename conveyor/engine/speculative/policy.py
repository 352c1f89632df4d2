"""How many draft tokens each sequence gets in a step: adapted to what it had accepted, paused
while its drafts miss, and bounded by the step's rows.

A draft token costs a row of the forward and of the lm_head whether it is accepted or not. A row
is nearly free while a forward is bound by reading the weights (a few decodes on CPU, dozens on a
GPU) and costs about its share of the GEMMs beyond that. So:

- per sequence (HF assisted generation's schedule): +2 after a draft taken whole, -1 after a miss;
  while the share of its draft tokens accepted (a moving average) is under `MIN_ACCEPTANCE`, its
  drafts pause for 1, 2, 4 ... up to `MAX_PAUSE` decodes between tries, until the average is back
  over it: text the lookup cannot predict costs next to nothing. A decode alone in its step drafts
  even while paused: its few rows are free there (free prose, one stream: 1.05x drafting at 12 %
  acceptance, 0.96x paused; docs/engine.md);
- per step: the drafts' rows fit in `row_budget` less the step's decodes, handed out first to the
  sequences whose last drafts were accepted longest (the likeliest to pay), so a large batch
  speculates only where it pays, and one above the budget not at all.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PAUSE = 32  # decodes: a sequence that stopped matching is tried again at least this often
# Below this share of draft tokens accepted a draft row costs about what it saves on CPU (a row
# ~1.5-1.9 ms past ~5 rows against ~6 ms per token of a 4-decode step; docs/engine.md).
MIN_ACCEPTANCE = 0.4
WEIGHT = 0.3  # of the latest draft in the moving average of acceptance

# Rows of a step (decodes and drafts) up to which drafts are proposed. On CPU a decode forward of
# the default model costs ~24 ms up to ~5 rows and ~1.5-1.9 ms per row beyond (docs/engine.md has
# the figures): a draft row pays only where the batch is small. On a GPU a decode forward reads the
# weights at the same cost up to a hundred rows or more (an estimate; not measured on a device yet).
CPU_ROW_BUDGET = 16
GPU_ROW_BUDGET = 128


def row_budget(device: str) -> int:
    return CPU_ROW_BUDGET if device == "cpu" else GPU_ROW_BUDGET


@dataclass(slots=True)
class DraftState:
    """A sequence's speculation: the longest draft it gets next, and its pause after misses."""

    limit: int
    # Moving average of the share of draft tokens accepted; with no history a half, so that text the
    # lookup cannot predict pauses after its first miss.
    acceptance: float = 0.5
    pause: int = 0  # decodes left without a draft
    last_pause: int = 0  # the last pause's length (doubles on the next one)

    def ready(self) -> bool:
        """Whether this decode may get a draft (a paused one counts a decode down instead)."""
        if self.pause:
            self.pause -= 1
            return False
        return True

    def update(self, proposed: int, accepted: int, most: int) -> None:
        """After verification: `accepted` of `proposed` draft tokens; `most`: the setting's k."""
        self.acceptance += WEIGHT * (accepted / proposed - self.acceptance)
        self.limit = min(most, self.limit + 2) if accepted == proposed else max(1, self.limit - 1)
        if self.acceptance >= MIN_ACCEPTANCE:
            self.last_pause = 0
        else:  # a token accepted now and then (common words) does not end the pausing
            self.last_pause = self.pause = min(MAX_PAUSE, max(1, 2 * self.last_pause))


def share_rows(wanted: list[int], budget: int) -> list[int]:
    """Draft tokens per sequence from each one's `wanted` (its draft's length) within `budget` rows
    in all, the longest drafts served first (ties in order): a draft is long where the sequence's
    drafts were accepted and the lookup found a long continuation."""
    given = [0] * len(wanted)
    for i in sorted(range(len(wanted)), key=lambda i: -wanted[i]):
        given[i] = min(wanted[i], max(0, budget))
        budget -= given[i]
    return given
