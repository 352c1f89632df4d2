"""The simulated engine (`--engine sim`): the real engine with no model behind it.

For capacity planning and tests, never a default. The scheduler, block manager, prefix cache,
preemption, detokenizer and stop handling are the real ones; only the forward and the sampler are
replaced. `SimRunner.execute` blocks for the step time a GPU would take (conveyor/engine/sim_timing.py;
time.sleep releases the GIL, as a CUDA sync does) and `SimSampler` draws each token by a rule:

    h = blake2b-64(salt ‖ prompt ids as uint32 little-endian);  token_0 = vocab[h mod |vocab|]
    h = splitmix64(h xor token_i);                              token_{i+1} = vocab[h mod |vocab|]

`salt` is 0 for greedy requests and the request's seed for sampled ones (so seeded requests are
reproducible, forks of one request differ, and an unseeded sampled request varies as with a
model). `vocab` is the tokenizer's ordinary tokens: no special or added token, and only tokens
that decode alone to text without U+FFFD. EOS is never drawn: max_new_tokens, a stop sequence or
max_model_len ends a request. Logprobs are 0.0 (the drawn token is certain); top_n_tokens lists it alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from array import array
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.prompt_logprobs import PromptScore, scored_positions
from conveyor.engine.sampler import SamplerOutput, _splitmix64
from conveyor.engine.sequence import Sequence
from conveyor.engine.sim_timing import StepTimeModel
from conveyor.engine.step_plan import ScheduledChunk

log = logging.getLogger(__name__)


def prompt_state(salt: int, prompt_ids: Seq[int]) -> int:
    data = salt.to_bytes(8, "little") + array("I", prompt_ids).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def ordinary_vocab(tokenizer: Any) -> list[int]:
    """Token ids a simulated model draws from: not special or added, decoding alone to whole text."""
    excluded = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    ids = [i for i in range(len(tokenizer)) if i not in excluded]
    texts = tokenizer.batch_decode([[i] for i in ids])
    vocab = [i for i, text in zip(ids, texts, strict=True) if text and "\ufffd" not in text]
    if not vocab:
        raise ValueError("the tokenizer has no ordinary token for the simulated engine to draw")
    return vocab


class SimSampler:
    """Draws each row's token by the rule above, in O(1) per row: a sequence's hash state is kept
    between steps (a sequence the step does not sample, e.g. preempted, is folded again from its
    tokens when it next samples)."""

    def __init__(self, vocab: list[int]) -> None:
        self.vocab = vocab
        self._states: dict[int, tuple[Sequence, int, int]] = {}  # id(seq) → (seq, tokens folded, state)

    def sample(self, logits: Any, seqs: list[Sequence]) -> SamplerOutput:
        states: dict[int, tuple[Sequence, int, int]] = {}
        token_ids: list[int] = []
        vocab, size, old = self.vocab, len(self.vocab), self._states
        for seq in seqs:
            entry = old.get(id(seq))
            tokens = seq.token_ids
            if entry is not None and entry[0] is seq:
                folded, h = entry[1], entry[2]
            else:
                folded, h = len(seq.prompt_ids), prompt_state(self._salt(seq), seq.prompt_ids)
            for i in range(folded, len(tokens)):  # one token a step, but a resumed or preempted all
                h = _splitmix64(h ^ tokens[i])
            states[id(seq)] = (seq, len(tokens), h)
            token_ids.append(vocab[h % size])
        self._states = states  # only this step's: finished sequences are forgotten
        tops = [[(t, 0.0)] if s.sampling.top_n_tokens else [] for s, t in zip(seqs, token_ids, strict=True)]
        return SamplerOutput(token_ids, [0.0] * len(seqs), tops)

    @staticmethod
    def _salt(seq: Sequence) -> int:
        return 0 if seq.sampling.greedy else (seq.sampling.seed or 0)


class SimRunner:
    """In place of ModelRunner: KV blocks only counted (no memory), a step that sleeps its modelled time."""

    device = "sim"
    dtype = "bfloat16"

    def __init__(self, model: StepTimeModel, config: EngineConfig, max_model_len: int | None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.model = model
        self.block_size = config.block_size
        self.max_model_len = max_model_len
        self.num_blocks = sim_num_blocks(model, config)
        self.sleep = sleep
        self.clock = clock
        self.observer = None  # Engine.observe sets it; nothing here reports pieces
        self.modelled_s = 0.0  # the sum of the modelled step times (tests, benchmarks)

    def kv_cache_summary(self) -> str:
        tokens = self.num_blocks * self.block_size
        gib = tokens * self.model.kv_bytes_per_token / 2**30
        return f"{self.num_blocks} blocks = {tokens} tokens (simulated: {gib:.1f} GiB of bfloat16 K/V)"

    def execute(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        """No logits: [rows that sample, 0]; SimSampler draws from the sequences themselves."""
        started = self.clock()
        seconds = self.model.step_seconds(chunks)
        self.modelled_s += seconds
        for c in chunks:
            positions = scored_positions(c.seq, c.start, c.length)
            c.prompt_scores += [PromptScore(0.0, ())] * len(positions)
        out = torch.empty((sum(1 for c in chunks if c.sample), 0))
        remaining = seconds - (self.clock() - started)
        if remaining > 0:
            self.sleep(remaining)
        return out

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of forks' blocks: nothing to copy, the block manager's accounting is real."""


def sim_num_blocks(model: StepTimeModel, config: EngineConfig) -> int:
    """As the real engine on CUDA: num_blocks, else kv_cache_memory, else kv_cache_fraction of the
    (simulated) GPU memory less the weights; blocks of kv_bytes_per_token × block_size."""
    if config.num_blocks is not None:
        return config.num_blocks
    budget = config.kv_cache_memory or model.kv_budget_bytes(config.kv_cache_fraction)
    per_block = model.kv_bytes_per_token * config.block_size
    blocks = int(budget // per_block)
    if blocks < 1:
        raise ValueError(f"the simulated KV cache budget ({budget} bytes) holds no block of "
                         f"{config.block_size} tokens: raise kv_cache_memory or kv_cache_fraction")
    return blocks


def _max_positions(path: Path) -> int | None:
    """The positions the model was trained for (config.json), as the real runner's max_model_len."""
    config = path / "config.json"
    value = json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else None
    return value if isinstance(value, int) else None


class SimEngine(Engine):
    """Engine with a SimRunner and a SimSampler. Structured output is refused: the rule above
    knows no grammar, and drawing outside it would break the matcher."""

    def add(self, request_id: str, prompt_ids: Seq[int], sampling: Any = None, *args: Any,
            **kwargs: Any) -> None:
        if sampling is not None and sampling.grammar is not None:
            raise ValueError("the simulated engine (--engine sim) does not do structured output")
        super().add(request_id, prompt_ids, sampling, *args, **kwargs)

    @classmethod
    def from_model_dir(cls, path: str | Path, config: EngineConfig, model: StepTimeModel) -> SimEngine:
        """From a model directory's tokenizer and config.json (max_position_embeddings); no weights."""
        from conveyor.engine.loader import eos_token_ids, load_tokenizer

        tokenizer = load_tokenizer(path)
        config = replace(config, speculate=0)  # the rule has no logits to verify a draft against
        runner = SimRunner(model, config, _max_positions(Path(path)))
        engine = cls(runner, tokenizer, config, eos_token_ids(path), runner.max_model_len)
        engine.sampler = SimSampler(ordinary_vocab(tokenizer))  # type: ignore[assignment]
        log.info("simulated engine (no model): KV cache %s", runner.kv_cache_summary())
        return engine
