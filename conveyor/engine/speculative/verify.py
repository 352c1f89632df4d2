"""Speculative decoding in the engine's step: draft tokens proposed for decodes, verified by the
same forward, the rejected ones' KV given back.

A decoding sequence's chunk gets a draft of up to k tokens (ngram.py); the model runner computes
its last token and the draft as 1 + k decode rows (each sees the context up to its own position),
so each row's logits are bit for bit those that decoding the same tokens one step at a time gives
(CPU fp32 is batch-invariant: docs/engine.md). The sampler chooses at every row as it would at
that token's index, and the draft's longest prefix equal to its choices is kept, plus the choice
after it (the "bonus" token): 1 to k + 1 tokens per forward.

For a greedy request that is the same tokens as without speculation. For a sampled one it is
standard speculative sampling (Leviathan et al., Chen et al.) with a deterministic proposer: the
draft distribution q is a point mass on the drafted token x, so the rule is "accept x with
probability p(x); on a rejection draw from norm(max(p - q, 0)), p without x renormalised; stop".
The sampler's draw is an inverse CDF of p at a uniform u: it lands on x with probability p(x), and
otherwise on a token from p without x, renormalised. So "draw, accept while the draw is x" is that
rule, with p computed by the sampler itself (bias, temperature, top-k/top-p/typical-p), and since u
is the one (seed, token index) gives without speculation, a seeded request's tokens are even the
same as with speculation off (given the same logits: on CPU fp32, bit for bit). Logprobs and top-n
are those of p at each position, as without speculation.

Rollback: the draft's positions got blocks only from unhashed free blocks (never evicting the
prefix cache, never preempting: drafts are placed after the scheduler's own allocations); after
verification the table is cut back to the computed tokens and only full blocks of accepted tokens
reach the prefix cache, so block counts and hashes equal a run without speculation.

Speculating only where it is exact: greedy or sampled requests without penalties (which would
need each position's token counts), grammar (each position's matcher state) or forks still to
start, and that did not turn it off (`SamplingParams.speculate`). Others decode one token a step,
unchanged. Where it is cheap: policy.py (draft lengths adapted per sequence, paused while drafts
miss, within a budget of rows per step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from conveyor.engine.block_manager import BlockManager
from conveyor.engine.events import TokenEvent
from conveyor.engine.sampler import Sampler
from conveyor.engine.sequence import Sequence
from conveyor.engine.speculative.ngram import NgramProposer, Proposer
from conveyor.engine.speculative.policy import CPU_ROW_BUDGET, DraftState, share_rows
from conveyor.engine.step_plan import ScheduledChunk, SchedulerOutput

Emit = Callable[[Sequence, int, float, list[tuple[int, float]]], TokenEvent]


@dataclass(slots=True)
class SpecStats:
    """Totals since start (vLLM's spec_decode counters): drafts, their tokens, tokens accepted."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


def speculates(seq: Sequence) -> bool:
    """Whether seq's next tokens can be verified exactly several at a time (see the module doc)."""
    p = seq.sampling
    return (p.speculate and not p.uses_penalties and seq.matcher is None and not seq.forks
            and seq.num_generated > 0)


class Speculator:
    def __init__(
        self,
        num_tokens: int,
        block_manager: BlockManager,
        proposer: Proposer | None = None,
        max_model_len: int | None = None,
        row_budget: int = CPU_ROW_BUDGET,
    ) -> None:
        if num_tokens < 0:
            raise ValueError(f"speculative tokens must be >= 0, got {num_tokens}")
        self.num_tokens = num_tokens  # 0: off
        self.block_manager = block_manager
        self.proposer: Proposer = proposer or NgramProposer()
        self.max_model_len = max_model_len
        self.row_budget = row_budget
        self.stats = SpecStats()

    def propose(self, output: SchedulerOutput) -> list[ScheduledChunk]:
        """Give eligible decodes of `output` a draft and its blocks; returns those chunks."""
        if not self.num_tokens:
            return []
        decodes = [c for c in output.chunks if c.length == 1 and c.sample]
        budget = self.row_budget - len(decodes)
        if budget <= 0:
            return []
        candidates: list[tuple[ScheduledChunk, list[int]]] = []
        for chunk in decodes:
            seq = chunk.seq
            if not speculates(seq):
                continue
            if seq.drafting is None:
                seq.drafting = DraftState(self.num_tokens)
            # Alone, a sequence's draft rows ride free on a forward that reads all the weights anyway
            # (policy.py): it drafts even while paused.
            if not seq.drafting.ready() and len(decodes) > 1:
                continue
            # Never past what the request may still generate: the last token is the bonus one.
            k = min(seq.drafting.limit, seq.stopping.max_new_tokens - seq.num_generated - 1)
            if self.max_model_len is not None:
                k = min(k, self.max_model_len - seq.num_tokens)
            draft = self.proposer.propose(seq.token_ids, k) if k > 0 else []
            if draft:
                candidates.append((chunk, draft))
        drafted = []
        for (chunk, draft), share in zip(candidates, share_rows([len(d) for _, d in candidates], budget),
                                         strict=True):
            room = self.block_manager.extend_for_draft(chunk.seq, share) if share else 0
            if room:
                chunk.draft = draft[:room]
                drafted.append(chunk)
        return drafted

    def split(self, chunks: list[ScheduledChunk], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The runner's logits as (rows of the chunks without a draft, rows of those with one)."""
        plain: list[int] = []
        drafted: list[int] = []
        row = 0
        for c in chunks:
            if c.sample:
                n = 1 + len(c.draft)
                (drafted if c.draft else plain).extend(range(row, row + n))
                row += n
        def pick(rows: list[int]) -> torch.Tensor:
            return logits[torch.tensor(rows, dtype=torch.long, device=logits.device)]

        return pick(plain), pick(drafted)

    def verify(self, drafted: list[ScheduledChunk], logits: torch.Tensor, sampler: Sampler,
               emit: Emit) -> list[TokenEvent]:
        """Accept each draft's longest prefix the sampler agrees with, and the token after it; emit
        them one by one (a stop, EOS or the length limit ends the sequence and drops the rest).
        Runs after the scheduler's `complete`, which counted the chunk's own token."""
        bm = self.block_manager
        rows = [(c.seq, j) for c in drafted for j in range(1 + len(c.draft))]
        # Row j draws with the uniform of the token j places on: as a step at a time would.
        sampled = sampler.sample(logits, [seq for seq, _ in rows], [j for _, j in rows])
        events: list[TokenEvent] = []
        row = 0
        for chunk in drafted:
            seq, draft, first = chunk.seq, chunk.draft, row
            row += 1 + len(draft)
            if seq.is_finished:  # aborted since schedule(): its blocks are already free
                continue
            tokens = sampled.token_ids[first:row]
            accepted = 0
            while accepted < len(draft) and tokens[accepted] == draft[accepted]:
                accepted += 1
            self.stats.num_drafts += 1
            self.stats.num_draft_tokens += len(draft)
            self.stats.num_accepted_tokens += accepted
            if seq.drafting is not None:
                seq.drafting.update(len(draft), accepted, self.num_tokens)
            base = seq.num_computed_tokens
            for j in range(accepted + 1):
                # As a step at a time would: the KV of the tokens before this one is computed (and
                # its full blocks cached) when it is appended.
                seq.num_computed_tokens = base + j
                bm.cache_blocks(seq)
                seq.append_token(tokens[j])
                i = first + j
                events.append(emit(seq, tokens[j], sampled.logprobs[i], sampled.top_tokens[i]))
                if seq.is_finished:
                    break
            else:
                bm.truncate(seq)
        return events
