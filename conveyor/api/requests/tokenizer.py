"""Tokenizing in the api (as TGI's router does) keeps bad input out of the queue.

Uses the `tokenizers` library directly: the api process never loads torch.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


class PromptTokenizer:
    def __init__(self, model_dir: Path) -> None:
        path = Path(model_dir) / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} not found: the model directory needs a fast tokenizer (tokenizer.json); "
                "run `conveyor model convert` or point --model at a Hugging Face model directory"
            )
        self._tokenizer = Tokenizer.from_file(str(path))
        self.special_tokens = frozenset(
            t.content for t in self._tokenizer.get_added_tokens_decoder().values() if t.special
        )

    def has_special_tokens(self, text: str) -> bool:
        """True when the text already contains special tokens (e.g. a prompt someone templated)."""
        return any(token in text for token in self.special_tokens)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`add_special_tokens`: the tokenizer's own (a BOS, for a model that has one)."""
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_offsets(self, text: str) -> list[tuple[int, int, int]]:
        """(id, start, stop) per token: character offsets into `text` (TGI's /tokenize)."""
        encoding = self._tokenizer.encode(text)
        return [(i, start, stop) for i, (start, stop) in zip(encoding.ids, encoding.offsets, strict=True)]

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)
