"""The engine: add requests, step, get token events. Knows nothing of Redis or HTTP.

One `step()` is one forward over the batch the scheduler forms (decodes of every running sequence
plus prefill chunks of admitted ones), then sampling, detokenizing and stop checks for the rows
that produced a token.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.engine.block_manager import BlockManager
from conveyor.engine.config import EngineConfig
from conveyor.engine.detokenizer import Detokenizer, token_text
from conveyor.engine.events import PromptToken, TokenEvent, TopToken
from conveyor.engine.fork import choices_of, sequences
from conveyor.engine.grammar import GrammarCompiler
from conveyor.engine.params import SamplingParams, StoppingParams
from conveyor.engine.sampler import Sampler
from conveyor.engine.scheduler import Scheduler
from conveyor.engine.sequence import FinishReason, Sequence
from conveyor.engine.speculative.ngram import NgramProposer
from conveyor.engine.speculative.policy import row_budget
from conveyor.engine.speculative.verify import Speculator
from conveyor.engine.step_observer import StepObserver
from conveyor.wire.heartbeat import EngineLoad  # torch-free: the heartbeat and metrics read the same type

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class StepInfo:
    """The last step, for metrics: a step with any prefill chunk counts as a prefill step."""

    prefill_tokens: int  # tokens of prefill chunks (prompts, resumed contexts)
    rows: int  # sequences in the forward
    seconds: float  # the whole step: schedule, forward, sample, detokenize

    @property
    def method(self) -> str:
        return "prefill" if self.prefill_tokens else "decode"


class Engine:
    def __init__(
        self,
        runner: Any,
        tokenizer: Any,
        config: EngineConfig,
        eos_token_ids: set[int],
        max_model_len: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.special_ids = frozenset(tokenizer.all_special_ids) | self.eos_token_ids
        self.max_model_len = max_model_len
        self.clock = clock
        self.block_manager = BlockManager(runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager, clock, max_model_len=max_model_len)
        self.sampler = Sampler(build_kernel=str(getattr(runner, "device", "")) == "cpu")
        self.speculator = Speculator(
            config.speculate, self.block_manager,
            NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max), max_model_len,
            row_budget(str(getattr(runner, "device", "cpu"))),
        )
        self.grammars = GrammarCompiler(tokenizer, self.eos_token_ids)
        self._detokenizers: dict[tuple[str, int], Detokenizer] = {}  # by (request id, choice)
        self._steps = 0
        # (chunks, step seconds, forward seconds) of recent steps: the engine's own overhead.
        self._timings: deque[tuple[int, float, float]] = deque(maxlen=100_000)
        self.last_step: StepInfo | None = None  # the last step that ran a forward
        self.observer: StepObserver | None = None  # a profiler's (step_observer.py); None: none

    def observe(self, observer: StepObserver | None) -> None:
        """Report the pieces of every step to `observer` from now on (None: stop)."""
        self.observer = observer
        for part in (self.runner, getattr(self.runner, "model", None)):
            if part is not None and hasattr(part, "observer"):
                part.observer = observer

    @classmethod
    def from_pretrained(cls, path: str | Path, config: EngineConfig | None = None) -> Engine:
        from conveyor.engine.loader import eos_token_ids, load_tokenizer
        from conveyor.engine.model_runner import ModelRunner

        config = config or EngineConfig()
        runner = ModelRunner.from_pretrained(path, config)
        log.info("KV cache: %s", runner.kv_cache_summary())
        tokenizer = load_tokenizer(path)
        return cls(runner, tokenizer, config, eos_token_ids(path), getattr(runner, "max_model_len", None))

    # --- requests ---------------------------------------------------------------------------

    def add(
        self,
        request_id: str,
        prompt_ids: Seq[int],
        sampling: SamplingParams | None = None,
        stopping: StoppingParams | None = None,
        priority: int = 0,
        deadline: float | None = None,
        generated: Seq[int] = (),
        n: int = 1,
        resumed: Mapping[int, Seq[int]] | None = None,
    ) -> None:
        """Queue a request. `generated`: tokens another worker already produced (resume).
        `n`: sequences (choices) sampled from the one prompt, sharing its KV blocks (conveyor/engine/fork.py).
        `resumed`: instead of n and generated, the choices still to run and each one's tokens."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty: a request needs at least one prompt token")
        if self.scheduler.has(request_id):
            raise ValueError(f"request {request_id!r} is already in the engine")
        sampling = sampling or SamplingParams()
        if not sampling.greedy and sampling.seed is None:
            # Every sampled request gets a seed: reported to the client, and what makes a resumed
            # request continue exactly (token i is drawn from a generator seeded by (seed, i)).
            sampling = dataclasses.replace(sampling, seed=random.getrandbits(63))
        stopping = stopping or StoppingParams()
        choices = choices_of(n, generated, resumed)
        seqs = sequences(request_id, prompt_ids, sampling, stopping, priority, deadline, choices)
        for seq in seqs:
            self.scheduler.add(seq)  # the same size for every choice: the first refuses them all
        for choice, tokens in choices.items():
            self._detokenizers[request_id, choice] = Detokenizer(
                self.tokenizer, stopping.stop, self.special_ids, generated=tokens,
                include_stop=stopping.include_stop_str_in_output,
            )
        if sampling.grammar is not None:  # every choice walks the grammar on its own
            for seq in seqs:
                for s in (seq, *seq.forks):
                    s.matcher = self.grammars.matcher(sampling.grammar, s.generated_ids)

    def abort(self, request_id: str) -> list[TokenEvent]:
        """Finish a request now and free its KV blocks; returns the final event of each of its
        choices still running (none if unknown)."""
        return [e for seq in self.scheduler.abort(request_id) for e in self._end(seq, FinishReason.ABORTED)]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def capacity(self) -> int:
        return self.scheduler.capacity()

    def free_slots(self) -> int:
        return self.scheduler.free_slots()

    # --- the step ---------------------------------------------------------------------------

    def step(self) -> list[TokenEvent]:
        if (observer := self.observer) is None:
            return self._step()
        observer.start("step")
        try:
            return self._step()
        finally:
            observer.stop("step")

    def _step(self) -> list[TokenEvent]:
        started = time.perf_counter()
        if (observer := self.observer) is not None:
            observer.start("schedule")
        output = self.scheduler.schedule()
        if observer is not None:
            observer.stop("schedule")
        events = [e for seq in output.expired for e in self._end(seq, FinishReason.EXPIRED)]
        if output.is_empty:
            return events
        self._steps += 1
        prefill_tokens = sum(c.length for c in output.chunks if c.length > 1 or c.seq.num_generated == 0)
        drafted = self.speculator.propose(output)  # after the scheduler's allocations: never preempts
        sampling_seqs = [chunk.seq for chunk in output.chunks if chunk.sample and not chunk.draft]
        forward_started = time.perf_counter()
        copies = self.block_manager.take_copies()
        if copies:  # copy-on-write of forks' shared blocks; done before the forward, not after it
            self.runner.copy_blocks(copies)
        logits = self.runner.execute(output.chunks)
        forward_s = time.perf_counter() - forward_started
        self.scheduler.complete(output)
        events += self._scored(output.chunks)
        if drafted:
            logits, draft_logits = self.speculator.split(output.chunks, logits)
            events += self.speculator.verify(drafted, draft_logits, self.sampler, self._token_event)
        if sampling_seqs:
            sampling_seqs, logits = self._fork(sampling_seqs, logits)
            if observer is not None:
                observer.start("sampler")
            sampled = self.sampler.sample(logits, sampling_seqs)
            if observer is not None:
                observer.stop("sampler")
            for seq, token_id, logprob, top in zip(
                sampling_seqs, sampled.token_ids, sampled.logprobs, sampled.top_tokens, strict=True
            ):
                seq.append_token(token_id)
                if seq.matcher is not None:
                    seq.matcher.advance(token_id)
                event = self._token_event(seq, token_id, logprob, top)
                if event.index == 0 and seq.choice == 0 and seq.sampling.prompt_logprobs is not None:
                    event.prompt_tokens = self._prompt_tokens(seq)
                events.append(event)
        step_s = time.perf_counter() - started
        self._timings.append((len(output.chunks), step_s, forward_s))
        self.last_step = StepInfo(prefill_tokens, len(output.chunks), step_s)
        return events

    def _scored(self, chunks: list[Any]) -> list[TokenEvent]:
        """Keep the prompt scores the forward computed; end the scoring-only requests (max_new_tokens
        0) whose prompt is done, with their one event."""
        events = []
        for chunk in chunks:
            seq = chunk.seq
            if seq.is_finished:
                continue
            seq.prompt_scores += chunk.prompt_scores
            if chunk.completes and not chunk.sample:
                ended = self._end(seq, FinishReason.LENGTH)  # with its forks, which never start
                if seq.sampling.prompt_logprobs is not None:
                    ended[0].prompt_tokens = self._prompt_tokens(seq)
                events += ended
        return events

    def _prompt_tokens(self, seq: Sequence) -> list[PromptToken]:
        tok, special = self.tokenizer, self.special_ids
        ids = seq.prompt_ids
        out = [PromptToken(id=ids[0], text=token_text(tok, ids[0]), logprob=None)]
        for token_id, s in zip(ids[1:], seq.prompt_scores, strict=True):
            out.append(PromptToken(
                id=token_id, text=token_text(tok, token_id), logprob=s.logprob,
                top_tokens=[TopToken(id=i, text=token_text(tok, i), logprob=lp, special=i in special)
                            for i, lp in s.top],
            ))
        return out

    def _fork(self, seqs: list[Sequence], logits: Any) -> tuple[list[Sequence], Any]:
        """Seqs whose prompt is now computed start their forks, which sample their first token from
        the same logits row (each with its own seed)."""
        if not any(seq.forks for seq in seqs):
            return seqs, logits
        out: list[Sequence] = []
        rows: list[int] = []
        for row, seq in enumerate(seqs):
            family = [seq, *self.scheduler.fork(seq)] if seq.forks else [seq]
            out += family
            rows += [row] * len(family)
        return out, logits[rows]

    def _end(self, seq: Sequence, reason: FinishReason) -> list[TokenEvent]:
        """Final events of a sequence that ends without a token, and of its forks not started."""
        forks, seq.forks = seq.forks, ()
        events = [self._finish_event(seq, reason)]
        for child in forks:
            child.finish(reason)
            events.append(self._finish_event(child, reason))
        return events

    def _token_event(
        self, seq: Sequence, token_id: int, logprob: float, top: list[tuple[int, float]]
    ) -> TokenEvent:
        detokenizer = self._detokenizers[seq.request_id, seq.choice]
        text, stopped = detokenizer.push(token_id)
        special = token_id in self.special_ids
        reason: FinishReason | None = None
        if stopped:
            reason = FinishReason.STOP_SEQUENCE
        elif token_id in self.eos_token_ids and not seq.stopping.ignore_eos:
            reason = FinishReason.EOS
        elif seq.num_generated >= seq.stopping.max_new_tokens or (
            self.max_model_len is not None and seq.num_tokens >= self.max_model_len
        ):
            reason = FinishReason.LENGTH
        event = TokenEvent(
            request_id=seq.request_id,
            choice=seq.choice,
            index=seq.num_generated - 1,
            token_id=token_id,
            text=text,
            logprob=logprob,
            special=special,
            top_tokens=[
                TopToken(id=i, text=token_text(self.tokenizer, i), logprob=lp, special=i in self.special_ids)
                for i, lp in top
            ],
        )
        if reason is not None:
            held = detokenizer.flush() if reason is not FinishReason.STOP_SEQUENCE else ""
            if held:
                # Text held back for a stop sequence that never completed comes out with the last
                # token; on EOS that event then carries text, so it is not marked special.
                event.text = held if special else event.text + held
                event.special = False
            self._finish(seq, reason, event)
        return event

    def _finish_event(self, seq: Sequence, reason: FinishReason) -> TokenEvent:
        """The final event of a request that ends without a token of its own."""
        detokenizer = self._detokenizers.get((seq.request_id, seq.choice))
        event = TokenEvent(
            request_id=seq.request_id,
            choice=seq.choice,
            index=seq.num_generated,
            token_id=None,
            text=detokenizer.flush() if detokenizer else "",
        )
        self._finish(seq, reason, event)
        return event

    def _finish(self, seq: Sequence, reason: FinishReason, event: TokenEvent) -> None:
        if not seq.is_finished:
            self.scheduler.finish(seq, reason)
        detokenizer = self._detokenizers.pop((seq.request_id, seq.choice), None)
        event.finish_reason = reason
        event.generated_text = detokenizer.text if detokenizer else ""
        event.num_prompt_tokens = seq.num_prompt_tokens
        event.num_generated_tokens = seq.num_generated
        event.num_cached_tokens = seq.num_cached_tokens
        event.seed = seq.sampling.seed

    # --- introspection ----------------------------------------------------------------------

    def reset_timings(self) -> None:
        self._timings.clear()

    def overhead_share(self, min_batch: int = 1) -> float:
        """Share of step time spent outside the forward (scheduling, sampling, detokenizing),
        over recorded steps with at least `min_batch` sequences."""
        rows = [t for t in self._timings if t[0] >= min_batch]
        total = sum(t[1] for t in rows)
        return 1.0 - sum(t[2] for t in rows) / total if total else 0.0

    def stats(self) -> EngineLoad:
        bm = self.block_manager
        return EngineLoad(
            running=self.scheduler.num_running,
            waiting=self.scheduler.num_waiting,
            prefill_backlog_tokens=self.scheduler.prefill_backlog,
            blocks_used=bm.num_used_blocks,
            blocks_free=bm.num_free_blocks,
            prefix_cache_hit_rate=bm.prefix_cache_hit_rate,
            prefix_cache_queried_tokens=bm.num_queried_tokens,
            prefix_cache_hit_tokens=bm.num_hit_tokens,
            preemptions=self.scheduler.num_preemptions,
            steps=self._steps,
            spec_drafts=self.speculator.stats.num_drafts,
            spec_draft_tokens=self.speculator.stats.num_draft_tokens,
            spec_accepted_tokens=self.speculator.stats.num_accepted_tokens,
        )
