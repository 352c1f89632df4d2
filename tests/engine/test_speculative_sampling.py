"""Speculative sampling (verify.py): for sampled requests the emitted tokens follow exactly the
distribution of decoding one token a step. The rule on hand-made distributions, the engine's
output distribution with speculation on against off (chi-square, independent seeds), and seeded
reproducibility. The seeds are fixed, so every test here is deterministic."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
import torch

from conveyor.engine.block_manager import BlockManager
from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.events import TokenEvent
from conveyor.engine.params import SamplingParams, StoppingParams
from conveyor.engine.sampler import Sampler
from conveyor.engine.sequence import Sequence
from conveyor.engine.speculative.verify import Speculator
from conveyor.engine.step_plan import ScheduledChunk

ALPHA = 1e-3  # each test's false-alarm rate were its seeds drawn at random


def chi_square_p(observed: list[list[int]], expected: list[float] | None = None) -> float:
    """p-value of Pearson's chi-square: counts against probabilities `expected` (goodness of fit),
    or, without them, of two rows of counts being one distribution (homogeneity)."""
    obs = torch.tensor(observed, dtype=torch.float64)
    if expected is not None:
        exp = obs.sum() * torch.tensor(expected, dtype=torch.float64)[None]
    else:
        exp = obs.sum(1, keepdim=True) * obs.sum(0, keepdim=True) / obs.sum()
    keep = exp.sum(0) > 0
    obs, exp = obs[:, keep], exp[:, keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = (obs.shape[1] - 1) * (obs.shape[0] if expected is not None else obs.shape[0] - 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


# --- the rule, on hand-made distributions --------------------------------------------------------

VOCAB = 8
PARAMS = {"do_sample": True, "temperature": 0.8, "top_k": 5, "logit_bias": ((3, 1.0),)}


def target(logits: torch.Tensor) -> torch.Tensor:
    """p as the test's own oracle computes it: bias, temperature, the 5 best, renormalised."""
    z = logits.clone()
    z[3] += 1.0
    z = z / 0.8
    z[z < z.topk(5).values[-1]] = float("-inf")
    return torch.softmax(z, -1)


def test_emitted_tokens_follow_p_at_every_drafted_position() -> None:
    n = 8000
    gen = torch.Generator().manual_seed(4)
    rows = torch.randn(3, VOCAB, generator=gen) * 1.5  # the logits of the 3 rows: 2 drafted, bonus
    p = [target(r) for r in rows]
    draft = [int(p[0].argsort()[-2]), int(p[1].argsort()[-2])]  # p 0.23 and 0.33: not the likeliest
    bm = BlockManager(num_blocks=3 * n + 8, block_size=4)
    spec = Speculator(2, bm)
    chunks = []
    for s in range(n):
        seq = Sequence(f"r{s}", [1, 2, 3, 4, 5, 6, 7, 0], SamplingParams(seed=s, **PARAMS),  # type: ignore[arg-type]
                       StoppingParams(max_new_tokens=50))
        seq.append_token(1)
        assert bm.allocate(seq, seq.num_tokens)
        seq.num_computed_tokens = seq.num_tokens - 1
        assert bm.extend_for_draft(seq, 2) == 2
        seq.num_computed_tokens += 1  # what the scheduler's complete() does after the forward
        chunks.append(ScheduledChunk(seq, seq.num_tokens - 1, 1, draft=list(draft)))
    emitted: dict[str, list[tuple[int, float]]] = {}

    def emit(seq: Sequence, token: int, logprob: float, top: object) -> TokenEvent:
        emitted.setdefault(seq.request_id, []).append((token, logprob))
        return TokenEvent(request_id=seq.request_id, choice=0, index=0, token_id=token, text="")

    spec.verify(chunks, rows.repeat(n, 1), Sampler(), emit)
    outs = [[t for t, _ in emitted[f"r{s}"]] for s in range(n)]
    # Each position's token is p's draw given the accepted tokens before it; after the first token
    # that is not the draft's (the rejection's replacement) nothing more is emitted.
    for j in range(3):
        reached = [o[j] for o in outs if o[:j] == draft[:j]]
        assert all(len(o) == j + 1 for o in outs if o[:j] == draft[:j] and (j == 2 or o[j] != draft[j]))
        counts = Counter(reached)
        assert all(p[j][t] > 0 for t in counts)  # never a token top-k removed
        assert len(reached) > 500
        assert chi_square_p([[counts[t] for t in range(VOCAB)]], p[j].tolist()) > ALPHA
    # Logprobs are those of p's row before truncation, as without speculation.
    for s in range(50):
        for j, (token, logprob) in enumerate(emitted[f"r{s}"]):
            z = rows[j].clone()
            z[3] += 1.0
            assert logprob == pytest.approx(float(torch.log_softmax(z / 0.8, -1)[token]), abs=1e-5)
    assert spec.stats.num_drafts == n


# --- the engine, speculation on against off -------------------------------------------------------

A, B, C = 1000, 2000, 3000
SET = (A, B, C)
# The bias makes A, B, C the top 3 (about 0.5, 0.3, 0.2: the tiny model's own logits move them a
# little, the same with speculation on or off); the prompt cycles through them, so prompt lookup
# always has a draft (mostly the next token of the cycle).
BIASED = SamplingParams(do_sample=True, temperature=0.9, top_k=3,
                        logit_bias=((A, 30.0), (B, 29.5), (C, 29.1)))
PROMPT = [A, B, C] * 3
NEW = 5


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> dict[int, Engine]:
    def make(k: int) -> Engine:
        return Engine.from_pretrained(tiny_model_dir, EngineConfig(
            num_blocks=256, block_size=16, device="cpu", dtype="float32", speculate=k))
    return {0: make(0), 4: make(4)}


def generate(engine: Engine, seeds: range, sampling: SamplingParams = BIASED) -> dict[int, list[TokenEvent]]:
    """Each seed's request, a few at a time: the step's row budget leaves each a draft of 3 tokens
    (policy.py)."""
    out: dict[int, list[TokenEvent]] = {}
    stop = StoppingParams(max_new_tokens=NEW, ignore_eos=True)
    size = engine.speculator.row_budget // 4
    for group in range(seeds.start, seeds.stop, size):
        for s in range(group, min(group + size, seeds.stop)):
            engine.add(str(s), PROMPT, dataclasses.replace(sampling, seed=s), stop)
        while engine.has_unfinished():
            for e in engine.step():
                out.setdefault(int(e.request_id), []).append(e)
    return out


def test_sampled_output_distribution_is_the_same_with_speculation(engines: dict[int, Engine]) -> None:
    n = 200
    before = engines[4].speculator.stats.num_accepted_tokens
    # Independent seeds: a comparison of distributions, not of the same draws.
    off = generate(engines[0], range(n))
    on = generate(engines[4], range(10**6, 10**6 + n))
    accepted = engines[4].speculator.stats.num_accepted_tokens - before
    assert accepted > n // 2  # drafts were accepted, as well as rejected
    tokens = {k: [[e.token_id for e in evs] for evs in runs.values()]
              for k, runs in (("off", off), ("on", on))}
    assert all(len(t) == NEW and set(t) <= set(SET) for ts in tokens.values() for t in ts)
    # Each position after the first (the first is the prefill's, never drafted), the pairs of
    # consecutive tokens, and how often the second token is the first one's successor in the cycle
    # (the draft then), where accepting a draft too readily shows first.
    for j in range(1, NEW):
        table = [[sum(t[j] == x for t in tokens[k]) for x in SET] for k in ("off", "on")]
        assert chi_square_p(table) > ALPHA, (j, table)
    follows = [sum(SET.index(t[1]) == (SET.index(t[0]) + 1) % 3 for t in tokens[k]) for k in ("off", "on")]
    assert chi_square_p([[f, n - f] for f in follows]) > ALPHA, follows
    for j in range(3):
        pairs = [Counter((t[j], t[j + 1]) for t in tokens[k]) for k in ("off", "on")]
        table = [[c[x, y] for x in SET for y in SET] for c in pairs]
        assert chi_square_p(table) > ALPHA, (j, table)


def test_seeded_requests_repeat_with_speculation_and_equal_it_off(engines: dict[int, Engine]) -> None:
    sampling = dataclasses.replace(BIASED, top_n_tokens=2)

    def run(k: int) -> list[tuple[object, ...]]:
        runs = generate(engines[k], range(40, 56), sampling)
        return [(s, e.index, e.token_id, e.logprob, e.top_tokens, e.text, e.finish_reason)
                for s, evs in sorted(runs.items()) for e in evs]

    before = engines[4].speculator.stats.num_accepted_tokens
    first, second = run(4), run(4)
    assert engines[4].speculator.stats.num_accepted_tokens > before
    assert first == second
    # The draw at each position is the one (seed, index) gives a step at a time: with the same
    # logits (CPU fp32), the very same tokens, logprobs and top-n as with speculation off.
    assert first == run(0)
