"""The model's chat template, rendered by transformers' own renderer (`render_jinja_template`), so
a template renders here exactly as `apply_chat_template` renders it: `{% break %}`/`{% continue %}`,
`{% generation %}`, transformers' `tojson` (not HTML-escaped), `raise_exception`, `strftime_now`,
`tools`, and the tokenizer's special tokens (`bos_token`, `eos_token`, ...) as variables.

`transformers.utils.chat_template_utils` needs jinja2 and numpy, not torch: the api process stays
free of torch (tests/api/test_chat_template.py checks it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

# transformers annotates it `-> str`; it returns (the rendered conversations, generation indices).
_render: Callable[..., tuple[list[str], Any]] = render_jinja_template  # type: ignore[assignment]


class ChatTemplateError(ValueError):
    pass


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        _compile_jinja_template(source)  # a template that does not parse fails at start-up, not per request
        self._source = source
        self._special = special_tokens

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> ChatTemplate | None:
        model_dir = Path(model_dir)
        config: dict[str, Any] = {}
        config_path = model_dir / "tokenizer_config.json"
        if config_path.exists():
            config = json.loads(config_path.read_text())
        source = None
        if (model_dir / "chat_template.jinja").exists():
            source = (model_dir / "chat_template.jinja").read_text()
        elif isinstance(config.get("chat_template"), str):
            source = config["chat_template"]
        if not source:
            return None
        names = ("bos_token", "eos_token", "unk_token", "pad_token")
        special = {n: t for n in names if (t := _token_text(config.get(n))) is not None}
        return cls(source, special)

    @property
    def handles_tools(self) -> bool:
        """Whether the template renders `tools` itself (else conveyor/api/requests/tools.py describes
        them)."""
        return "tools" in self._source

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        try:
            rendered, _ = _render(
                conversations=[messages], tools=tools, chat_template=self._source,
                add_generation_prompt=add_generation_prompt, **self._special,
            )
        except (TemplateError, ValueError, TypeError) as exc:  # raise_exception, or messages it cannot take
            raise ChatTemplateError(f"the model's chat template rejected the messages: {exc}") from exc
        return str(rendered[0])
