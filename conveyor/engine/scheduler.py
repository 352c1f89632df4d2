"""Continuous batching: which tokens of which sequences the next forward processes.

No prefill or decode phase: a sequence has `num_computed_tokens` of `num_tokens`, and each step
gives it a chunk of what is left. One step = one forward:
  1. waiting requests past their deadline, never started, expire;
  2. every running sequence gets a chunk: one token to decode, or the next piece of its prefill
     within `max_batch_prefill_tokens` (decodes are free of that budget). When blocks run out, the
     lowest-priority, newest running sequence is preempted (its KV is dropped and recomputed later);
  3. waiting sequences are admitted in priority order while the budgets allow, their prefix-cache
     hits skipping compute. The first one that does not fit stops admission, so a large request is
     never starved by smaller ones behind it.
KV is not reserved for max_new_tokens: preemption is what makes optimistic admission safe.

Within one priority, waiting requests go shortest prefill first (`admission_order="shortest"`):
when a burst arrives together, short prompts get their first token without waiting for the long
ones ahead of them, which lowers the median time to first token and leaves the last one's where it
was (the same prefill is done in the same steps). The key is a virtual finish time counted in
prefill tokens: the tokens served before the request arrived plus its own. A later request passes it
only while fewer prefill tokens than its own length have been served since it arrived, so a long
prompt waits at most that long for newcomers, never forever. `"arrival"` is first come, first
served.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

from conveyor.engine.block_manager import BlockManager
from conveyor.engine.capacity import capacity
from conveyor.engine.config import EngineConfig
from conveyor.engine.prompt_logprobs import wants_scores
from conveyor.engine.sequence import FinishReason, Sequence, SequenceStatus
from conveyor.engine.step_plan import ScheduledChunk, SchedulerOutput


def _rank(seq: Sequence) -> tuple[int, int]:
    """Running order: higher priority first, then earlier arrival. Preemption takes the last."""
    return (-seq.priority, seq.order)


def _shortest_first(seq: Sequence) -> tuple[int, int, int]:
    """Waiting order: higher priority first, then the earliest virtual finish, then arrival."""
    return (-seq.priority, seq.admission_tag, seq.order)


ADMISSION_ORDERS = {"shortest": _shortest_first, "arrival": _rank}


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        clock: Callable[[], float] = time.time,
        max_model_len: int | None = None,
    ) -> None:
        self.config = config
        self.max_model_len = max_model_len  # the engine ends a sequence there (LENGTH)
        self.block_manager = block_manager
        self._clock = clock
        if config.admission_order not in ADMISSION_ORDERS:
            raise ValueError(
                f"admission_order {config.admission_order!r}: use one of {', '.join(ADMISSION_ORDERS)}"
            )
        self._waiting: list[Sequence] = []  # sorted by _waiting_rank
        self._prefill_served = 0  # prefill tokens scheduled so far: the admission tags' clock
        self._running: list[Sequence] = []  # sorted by _rank: the last is the next victim
        self._by_id: dict[str, dict[int, Sequence]] = {}  # request id → choice → its sequence
        self._num_preemptions = 0
        # When the last schedule() left a sequence waiting: the prefill budget the next step has
        # beside the backlog (0 when blocks, batch slots or batch tokens, not the budget, stopped
        # the admission); None when it left none.
        self._budget_ahead: int | None = None

    def _waiting_rank(self, seq: Sequence) -> tuple[int, ...]:
        # Read from the config each time, as the budgets are: a benchmark switches it between runs.
        return ADMISSION_ORDERS[self.config.admission_order](seq)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def prefill_backlog(self) -> int:
        """Prompt tokens still to prefill: running sequences' unprefilled chunks (a decoding
        sequence's one next token is not prefill) and waiting ones' prompts less the prefix the
        cache held for them when they arrived."""
        running = sum(s.num_uncomputed for s in self._running if s.num_uncomputed > 1)
        return running + sum(max(0, s.num_uncomputed - s.expected_hit_tokens) for s in self._waiting)

    @property
    def num_preemptions(self) -> int:
        return self._num_preemptions

    @property
    def has_unfinished(self) -> bool:
        return bool(self._running or self._waiting)

    @property
    def max_seq_len(self) -> int:
        """The most tokens one sequence can hold: all the KV blocks, and the batch token limit."""
        bm = self.block_manager
        limit = bm.num_blocks * bm.block_size
        if self.config.max_batch_total_tokens is not None:
            limit = min(limit, self.config.max_batch_total_tokens)
        return limit

    def get(self, request_id: str, choice: int = 0) -> Sequence | None:
        return self._by_id.get(request_id, {}).get(choice)

    def has(self, request_id: str) -> bool:
        return request_id in self._by_id

    def add(self, seq: Sequence) -> None:
        """Queue a new (or resumed: its token_ids carry the generated tokens) sequence.

        Rejects one that could not finish even alone in the cache: it would be preempted forever.
        """
        if self.get(seq.request_id, seq.choice) is not None:
            raise ValueError(f"request {seq.request_id!r} is already in the engine")
        if seq.is_finished or seq.block_table or seq.num_computed_tokens:
            raise ValueError(f"request {seq.request_id!r} is not a fresh sequence")
        remaining = max(0, seq.stopping.max_new_tokens - seq.num_generated)
        need = seq.num_tokens + remaining
        if self.max_model_len is not None:
            need = min(need, max(self.max_model_len, seq.num_tokens))
        if need > self.max_seq_len:
            raise ValueError(
                f"request {seq.request_id!r} needs up to {need} tokens ({seq.num_tokens} input +"
                f" {need - seq.num_tokens} new), more than the engine holds for one sequence"
                f" ({self.max_seq_len}): lower max_new_tokens or shorten the input"
            )
        if 1 + len(seq.forks) > self.config.max_batch_size:
            raise ValueError(
                f"request {seq.request_id!r} has {1 + len(seq.forks)} sequences, more than a batch"
                f" holds ({self.config.max_batch_size}): lower n / best_of or raise max_batch_size"
            )
        self._by_id.setdefault(seq.request_id, {})[seq.choice] = seq
        if not wants_scores(seq):
            bm = self.block_manager
            seq.expected_hit_tokens = len(bm.match_prefix(seq)) * bm.block_size
        seq.admission_tag = self._prefill_served + max(1, seq.num_uncomputed - seq.expected_hit_tokens)
        bisect.insort(self._waiting, seq, key=self._waiting_rank)

    def fork(self, parent: Sequence) -> list[Sequence]:
        """Start parent's pending forks: running, sharing its blocks (its prompt is computed)."""
        children, parent.forks = list(parent.forks), ()
        for child in children:
            self.block_manager.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            self._by_id.setdefault(child.request_id, {})[child.choice] = child
            bisect.insort(self._running, child, key=_rank)
        return children

    def abort(self, request_id: str) -> list[Sequence]:
        """Finish every sequence of the request; returns them (none: unknown request)."""
        seqs = list(self._by_id.get(request_id, {}).values())
        for seq in seqs:
            self.finish(seq, FinishReason.ABORTED)
        return seqs

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.finish(reason)
        self.block_manager.free(seq)
        self._remove(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._expire(out)
        full = self.config.max_batch_prefill_tokens
        budget = self._schedule_running(out, full)
        # Blocks ran short this step: admitting now would only preempt again next step.
        room = not out.preempted
        if room:
            room, budget = self._admit(out, budget)
        self._budget_ahead = None
        if self._waiting:
            # The backlog still counts this step's chunks (complete() has not run): take them off.
            self._budget_ahead = full - (self.prefill_backlog - (full - budget)) if room else 0
        return out

    def complete(self, output: SchedulerOutput) -> None:
        """Record that the forward computed every chunk of `output` (before sampled tokens are
        appended), and offer the blocks that became full to the prefix cache."""
        for chunk in output.chunks:
            seq = chunk.seq
            if seq.is_finished:  # aborted since schedule()
                continue
            if chunk.start != seq.num_computed_tokens:
                raise ValueError(
                    f"{seq.request_id}: chunk starts at {chunk.start}"
                    f" but {seq.num_computed_tokens} tokens are computed"
                )
            seq.num_computed_tokens += chunk.length
            self.block_manager.cache_blocks(seq)

    def free_slots(self) -> int:
        """Batch slots no sequence holds, running or waiting (a request's forks included)."""
        seqs = self._running + self._waiting
        return max(0, self.config.max_batch_size - len(seqs) - sum(len(s.forks) for s in seqs))

    def capacity(self) -> int:
        """How many new requests the engine could start now (conveyor/engine/capacity.py)."""
        return capacity(self._running, self._waiting, self.free_slots(), self.block_manager, self.config,
                        self._budget_ahead)

    def _expire(self, out: SchedulerOutput) -> None:
        now = self._clock()
        for seq in [s for s in self._waiting if s.status == SequenceStatus.WAITING]:
            if seq.deadline is not None and seq.deadline < now:
                self.finish(seq, FinishReason.EXPIRED)
                out.expired.append(seq)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Give each running sequence its chunk, best first, so that a victim (always the last) has
        no chunk yet. Returns the prefill budget left."""
        i = 0
        while i < len(self._running):
            seq = self._running[i]
            length = seq.num_uncomputed
            is_prefill = length > 1
            if is_prefill:
                length = min(length, budget)
            if length <= 0:  # prefill budget spent: it continues next step
                i += 1
                continue
            while not self.block_manager.allocate(seq, length):
                victim = self._running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, length))
                if is_prefill:
                    budget -= length
                    self._prefill_served += length
                i += 1
        return budget

    def _admit(self, out: SchedulerOutput, budget: int) -> tuple[bool, int]:
        """Start waiting sequences in order while the budget and the room last. Returns whether
        it stopped for the budget or an empty queue (not for want of blocks, batch slots or batch
        tokens), and the budget left."""
        bm = self.block_manager
        limit = self.config.max_batch_total_tokens
        # A chunked prefill counts with its whole prompt from its first chunk, so a later
        # admission cannot take the room it still needs.
        context = sum(s.num_tokens for s in self._running)
        num_admitted = 0
        room = True
        for seq in self._waiting:
            if budget <= 0:
                break
            # A request of n choices takes n batch slots (its forks join at its first token).
            if len(self._running) + len(seq.forks) >= self.config.max_batch_size or (
                limit is not None and context + seq.num_tokens > limit
            ):
                room = False
                break
            # A cached prefix has no logits: a request still to score its prompt computes it all.
            cached = [] if wants_scores(seq) else bm.match_prefix(seq)
            num_hit = len(cached) * bm.block_size
            length = min(seq.num_tokens - num_hit, budget)
            if not bm.allocate(seq, length, cached):
                room = False
                break
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self._running, seq, key=_rank)
            out.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, length))
            budget -= length
            self._prefill_served += length
            context += seq.num_tokens
            num_admitted += 1
        del self._waiting[:num_admitted]
        return room, budget

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Preempt by recompute: drop the KV, and queue the sequence again at its original rank."""
        self.block_manager.free(seq)
        self._running.remove(seq)
        seq.status = SequenceStatus.PREEMPTED
        bisect.insort(self._waiting, seq, key=self._waiting_rank)  # its old tag: near the front
        out.preempted.append(seq)
        self._num_preemptions += 1

    def _remove(self, seq: Sequence) -> None:
        choices = self._by_id.get(seq.request_id, {})
        if choices.get(seq.choice) is seq:
            del choices[seq.choice]
            if not choices:
                del self._by_id[seq.request_id]
        for queue in (self._running, self._waiting):
            if seq in queue:
                queue.remove(seq)
                return
