"""Constrained decoding: a token mask per row from a grammar, through llguidance.

Chosen over xgrammar (docs/engine.md, "Structured output", has the figures): compiling a JSON
schema takes milliseconds (xgrammar's took far longer, stalling every row's step for a new schema)
and the mask is noise beside a CPU step; it needs no torch.

A `GrammarCompiler` builds the tokenizer view once (lazily, only an engine that sees a
grammar pays it) and one matcher per distinct grammar (an LRU cache); each sequence gets a copy.
EOS is one of the grammar's tokens: the mask allows it only where the grammar accepts.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import llguidance
import numpy as np

from conveyor.engine.params import Grammar
from conveyor.wire.grammar import llguidance_grammar

_CACHE_SIZE = 64


class GrammarCompiler:
    def __init__(self, tokenizer: Any, eos_token_ids: frozenset[int]) -> None:
        self._hf_tokenizer = tokenizer
        self._eos = sorted(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[Grammar, llguidance.LLMatcher] = OrderedDict()

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            import llguidance.hf

            self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, eos_token=self._eos or None)
        return self._tokenizer

    def matcher(self, grammar: Grammar, generated: list[int]) -> GrammarMatcher:
        """A fresh matcher for one sequence, advanced over the tokens it already has (a resume)."""
        template = self._cache.get(grammar)
        if template is None:
            text = llguidance_grammar(grammar.kind, grammar.value)
            template = llguidance.LLMatcher(self.tokenizer, text, log_level=0)
            self._cache[grammar] = template
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(grammar)
        matcher = GrammarMatcher(template.deep_copy(), self.tokenizer.vocab_size, self._eos)
        for token in generated:
            matcher.advance(token)
        return matcher


class GrammarMatcher:
    """One sequence's position in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, eos: list[int]) -> None:
        self._m = matcher
        self._vocab = vocab_size
        self._eos = eos

    @property
    def error(self) -> str | None:
        return self._m.get_error() if self._m.is_error() else None

    def allowed(self, vocab: int) -> np.ndarray:
        """Bool [vocab]: the tokens the grammar allows next (logit rows may be wider than the
        tokenizer: the extra ids are never allowed). A matcher in error allows only EOS, so the
        sequence ends instead of sampling from nothing. numpy, single-threaded: torch would run
        these small ops on its intra-op pool, slow on a busy machine."""
        # Bit i of the little-endian words is token i.
        bits = np.unpackbits(np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = np.zeros(vocab, dtype=np.bool_)
        n = min(vocab, self._vocab, bits.size)
        allowed[:n] = bits[:n]
        if not allowed.any():
            allowed[[e for e in self._eos if e < vocab]] = True
        return allowed

    def fork(self) -> GrammarMatcher:
        """A copy at the same position (a sequence forked from this one continues from here)."""
        return GrammarMatcher(self._m.deep_copy(), self._vocab, self._eos)

    def advance(self, token: int) -> None:
        """Consume a chosen (or replayed) token; EOS ends the sequence, so it is not consumed."""
        if token not in self._eos:
            self._m.consume_token(token)
