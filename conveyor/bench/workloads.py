"""What a run sends: seeded, reproducible requests.

- random: random-token prompts of an exact token length, made the way `vllm bench serve
  --dataset-name random` makes them (numpy default_rng(seed); lengths uniform around the mean by
  `range_ratio`; token i of prompt j is allowed[(offset_j + j + i) % len(allowed)]; decoded, then
  re-encoded and cut or topped up until the text re-encodes to the target length), so its figures
  are comparable with the peers'.
- shared-prefix: the same random system prompt of `prefix_len` tokens before each random prompt
  (prefix-cache hits on servers that cache).
- stream-client: token-id prompts from Python's `random.Random(seed)`, the recipe of the streaming
  client the peer comparisons were first run with: every (prompt, output) length drawn first (mixed:
  `randint(32, 512)`, then `randint(16, 256)`, per request; else fixed), then each prompt's ids in
  turn, `randrange(100, vocab_size - 100)`.
- copy: "repeat this document word for word" prompts, each document seeded sentences from a fixed
  list until it reaches the prompt length: outputs copy their inputs, the case speculative
  decoding by prompt lookup (`--speculate`) is for; send it to the chat backends.
- jsonl: one request a line, `{"prompt": ...}` or `{"messages": [...]}`, optional `max_tokens`.
Lengths are "N" (fixed) or "LOW-HIGH" (uniform, inclusive).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def special_ids(self) -> set[int]: ...


@dataclass(frozen=True)
class Request:
    prompt: str | list[int] = ""  # text, or token ids (--prompt-format ids)
    prompt_len: int = 0  # tokens, as the workload made it (servers' usage wins when they report it)
    output_len: int = 128
    messages: list[dict[str, Any]] | None = None  # a chat (jsonl); else chat clients wrap the prompt
    extra: dict[str, Any] = field(default_factory=dict)


def parse_length(spec: str | int) -> tuple[int, int]:
    """"256" → (256, 256); "32-512" → (32, 512)."""
    text = str(spec).strip()
    low, dash, high = text.partition("-")
    try:
        lo, hi = int(low), int(high if dash else low)
    except ValueError:
        raise ValueError(f"a length is N or LOW-HIGH (e.g. 256 or 32-512), not {text!r}") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"a length range needs 1 <= LOW <= HIGH, not {text!r}")
    return lo, hi


def sample_lengths(rng: np.random.Generator, n: int, spec: str | int, range_ratio: float = 0.0) -> np.ndarray:
    """n lengths: uniform in LOW-HIGH, or around N by ±range_ratio (vLLM's --random-range-ratio)."""
    lo, hi = parse_length(spec)
    if lo == hi and range_ratio:
        if not 0 <= range_ratio < 1:
            raise ValueError("--range-ratio must be in [0, 1)")
        lo, hi = max(1, math.floor(lo * (1 - range_ratio))), math.ceil(hi * (1 + range_ratio))
    return rng.integers(lo, hi + 1, size=n)


def fit_to_length(tok: Tokenizer, ids: list[int], target: int, rng: np.random.Generator,
                  tries: int = 10) -> tuple[str, list[int]]:
    """Text that re-encodes to `target` tokens (as vLLM's gen_prompt_decode_to_target_len): decode,
    re-encode, cut or top up with random ids, at most `tries` times."""
    text = ""
    for _ in range(tries + 1):
        text = tok.decode(ids)
        ids = tok.encode(text)
        if len(ids) == target:
            break
        if len(ids) > target:
            ids = ids[:target]
        else:
            ids = ids + rng.integers(0, tok.vocab_size, size=target - len(ids)).tolist()
    return text, ids


def random_workload(tok: Tokenizer, n: int, input_len: str | int, output_len: str | int, seed: int = 0,
                    range_ratio: float = 0.0, prefix_len: int = 0, as_ids: bool = False) -> list[Request]:
    rng = np.random.default_rng(seed)
    in_lens = sample_lengths(rng, n, input_len, range_ratio)
    out_lens = sample_lengths(rng, n, output_len, range_ratio)
    offsets = rng.integers(0, tok.vocab_size, size=n)
    allowed = np.array(sorted(set(range(tok.vocab_size)) - tok.special_ids))
    prefix: list[int] = []
    if prefix_len > 0:
        prefix = fit_to_length(tok, allowed[rng.integers(0, len(allowed), size=prefix_len)].tolist(),
                               prefix_len, rng)[1]
    requests = []
    for j in range(n):
        inner = allowed[(int(offsets[j]) + j + np.arange(int(in_lens[j]))) % len(allowed)].tolist()
        target = len(prefix) + int(in_lens[j])
        text, ids = fit_to_length(tok, prefix + inner, target, rng)
        requests.append(Request(prompt=ids if as_ids else text, prompt_len=len(ids),
                                output_len=int(out_lens[j])))
    return requests


def stream_client_workload(vocab_size: int, n: int, mixed: bool, input_len: int = 256,
                           output_len: int = 128, seed: int = 0) -> list[Request]:
    """The stream-client recipe (module docstring): all lengths drawn first, then each prompt's
    ids in [100, vocab - 100), from one generator in that order, so a seed always makes the same
    requests."""
    rng = random.Random(seed)
    lens = [(rng.randint(32, 512), rng.randint(16, 256)) if mixed else (input_len, output_len)
            for _ in range(n)]
    return [Request(prompt=(ids := [rng.randrange(100, vocab_size - 100) for _ in range(n_in)]),
                    prompt_len=len(ids), output_len=n_out) for n_in, n_out in lens]


SENTENCES = (
    "The ferry leaves the north pier at seven and returns before the harbour lights come on.",
    "Each invoice lists the order number, the customer's address and the total due in euros.",
    "Our office moved to the third floor of the old brick building beside the river.",
    "The committee approved the budget after a short debate about the cost of new servers.",
    "Water the tomato plants every morning and keep them out of the strongest afternoon sun.",
    "The library closes early on Fridays, but the reading room stays open until nine.",
    "A backup runs every night and keeps the last thirty copies on a separate disk.",
    "Tickets for the spring concert go on sale next Monday at the front desk.",
    "The bridge over the valley was finished in 1932 and repaired after the flood of 1967.",
    "Please send the signed contract back to the legal team before the end of the month.",
    "The recipe needs two cups of flour, one egg, a pinch of salt and warm milk.",
    "Trains to the airport run every fifteen minutes from platform four.",
)


def copy_workload(tok: Tokenizer, n: int, input_len: str | int, output_len: str | int,
                  seed: int = 0) -> list[Request]:
    """Prompts that ask for a document back word for word (module docstring); a document is drawn
    sentence by sentence (random.Random(seed)) until the prompt has its tokens or more."""
    rng = random.Random(seed)
    in_lens = sample_lengths(np.random.default_rng(seed), n, input_len)
    out_lens = sample_lengths(np.random.default_rng(seed + 1), n, output_len)
    requests = []
    for j in range(n):
        text = "Repeat this document exactly, word for word:\n\n"
        while len(tok.encode(text)) < int(in_lens[j]):
            text += rng.choice(SENTENCES) + " "
        text = text.rstrip()
        requests.append(Request(prompt=text, prompt_len=len(tok.encode(text)), output_len=int(out_lens[j])))
    return requests


def jsonl_workload(path: Path, n: int | None, output_len: str | int, seed: int = 0,
                   tok: Tokenizer | None = None) -> list[Request]:
    """Lines of {"prompt": str | [ids]} or {"messages": [...]}; `max_tokens` per line wins over
    output_len; the first n lines (all when n is None), cycled when n is larger."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{path}: no requests (one JSON object a line)")
    n = len(rows) if n is None else n
    out_lens = sample_lengths(np.random.default_rng(seed), n, output_len)
    requests = []
    for j in range(n):
        row = rows[j % len(rows)]
        if "messages" not in row and "prompt" not in row:
            raise ValueError(f"{path}: line {j % len(rows) + 1} has neither 'prompt' nor 'messages'")
        prompt = row.get("prompt", "")
        text = prompt if isinstance(prompt, str) else ""
        if "messages" in row:
            text = "\n".join(str(m.get("content", "")) for m in row["messages"])
        plen = len(prompt) if isinstance(prompt, list) else (len(tok.encode(text)) if tok else 0)
        requests.append(Request(prompt=prompt, prompt_len=plen, messages=row.get("messages"),
                                output_len=int(row.get("max_tokens", out_lens[j]))))
    return requests


class HFTokenizer:
    """A `tokenizers` tokenizer.json (no transformers import: the client stays light)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as Tk

        file = path / "tokenizer.json" if path.is_dir() else path
        self._tk = Tk.from_file(str(file))
        self.vocab_size = self._tk.get_vocab_size()
        self.special_ids = {i for i, t in self._tk.get_added_tokens_decoder().items() if t.special}

    def encode(self, text: str) -> list[int]:
        return self._tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tk.decode(ids, skip_special_tokens=False)
