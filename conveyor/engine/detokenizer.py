"""Incremental, UTF-8-safe detokenization of one request's output, with stop sequences.

UTF-8 safety comes from `tokenizers.decoders.DecodeStream`: it buffers tokens until they decode to
whole characters (byte-level BPE, byte-fallback), so a piece never ends in a broken character.
On top of it, text that could still become the start of a stop sequence is held back until it
cannot; a completed stop sequence truncates the output right before it and is never released, or
(`include_stop`, TGI's behaviour) right after it, released with the token that completed it.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from functools import lru_cache
from typing import TYPE_CHECKING

from tokenizers.decoders import DecodeStream

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# Tokens of context decoded before the undecoded tail at flush, so the tail's first token decodes as
# it would mid-text (decoders that strip a leading space at the start of a text).
_FLUSH_CONTEXT = 4


class Detokenizer:
    """One request's output text. `push` each generated token; `flush` at a finish that is not a
    stop sequence. `generated`: tokens produced before (a resumed request), consumed at
    construction without releasing anything, so that what was already released is not repeated.
    `include_stop`: the matched stop sequence ends the output instead of being cut off."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast,
        stop: tuple[str, ...],
        special_ids: AbstractSet[int],
        generated: Iterable[int] = (),
        include_stop: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer
        self._stop = tuple(s for s in stop if s)
        self._special_ids = special_ids
        self._stream = DecodeStream(skip_special_tokens=False)
        self._ids: list[int] = []  # non-special tokens, in order
        self._num_decoded = 0  # how many of `_ids` the stream has turned into text
        self._released: list[str] = []
        self._held = ""
        self._stopped = False
        self._include_stop = include_stop
        for token_id in generated:
            self.push(token_id)

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def text(self) -> str:
        """The whole output so far, released and held back; without special tokens and without
        what follows a matched stop sequence (nor the stop sequence itself, unless included)."""
        return "".join(self._released) + self._held

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add a generated token. Returns (text released by it, stopped).

        A special token returns its own text, which is not part of `text`. After a stop, further
        tokens release nothing.
        """
        if token_id in self._special_ids:
            return token_text(self._tokenizer, token_id), self._stopped
        if self._stopped:
            return "", True
        self._ids.append(token_id)
        piece = self._stream.step(self._backend, token_id)
        if piece is None:  # an incomplete character: wait for the next token
            return "", False
        self._num_decoded = len(self._ids)
        return self._release(self._held + piece), self._stopped

    def flush(self) -> str:
        """Release everything still held back (finish by length, EOS or abort). Tokens that never
        completed a character come out as U+FFFD, as a full decode would write them."""
        if self._stopped:
            return ""
        out = self._held + self._undecoded_tail()
        self._held = ""
        self._num_decoded = len(self._ids)
        self._released.append(out)
        return out

    def _release(self, pending: str) -> str:
        """Split `pending` into what can go out now and what could still start a stop sequence."""
        # The earliest match; of two starting there, the shorter one completed first.
        cut, end = min(((i, i + len(s)) for s in self._stop if (i := pending.find(s)) >= 0), default=(-1, -1))
        if cut >= 0:
            self._stopped = True
            out, self._held = pending[: end if self._include_stop else cut], ""
        else:
            keep = _longest_stop_prefix_suffix(pending, self._stop)
            out, self._held = pending[: len(pending) - keep], pending[len(pending) - keep :]
        self._released.append(out)
        return out

    def _undecoded_tail(self) -> str:
        tail = self._ids[self._num_decoded :]
        if not tail:
            return ""
        context = self._ids[max(0, self._num_decoded - _FLUSH_CONTEXT) : self._num_decoded]
        prefix = self._backend.decode(context, skip_special_tokens=False)
        full = self._backend.decode(context + tail, skip_special_tokens=False)
        if full.startswith(prefix):
            return full[len(prefix) :]
        return self._backend.decode(tail, skip_special_tokens=False)


def _longest_stop_prefix_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is a proper prefix of a stop sequence."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


@lru_cache(maxsize=1 << 16)
def token_text(tokenizer: PreTrainedTokenizerFast, token_id: int) -> str:
    """The text of one token on its own (for top-n alternatives and special tokens). A token that
    is only part of a character reads as U+FFFD."""
    return tokenizer.backend_tokenizer.decode([token_id], skip_special_tokens=False)
