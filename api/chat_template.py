"""The model's chat template, rendered without transformers (the api loads no torch).

Same conventions as transformers' `apply_chat_template`: a sandboxed Jinja2 environment with
`trim_blocks`/`lstrip_blocks`, `raise_exception` and `strftime_now`, and the tokenizer's special
tokens (`bos_token`, `eos_token`, ...) as variables.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    pass


def _raise(message: str) -> None:
    raise TemplateError(message)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(source)
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

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self._special
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template rejected the messages: {exc}") from exc
