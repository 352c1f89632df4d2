"""Streaming a tool-choice chat job as OpenAI does: `delta.tool_calls` entries with `index`, the
first of each call with `id`, `type` and `function.name`, then pieces of `function.arguments`.

A named function streams its arguments token by token (the job's text is the arguments). `required`
and `auto` calls are sent whole when the job ends (a call is only known to parse once it is
complete); under `auto`, text before a `<tool_call>` streams as content, holding back only what
could still be the start of the tag.
"""

from __future__ import annotations

from typing import Any

from conveyor.api.requests.tools import OPEN, _call, _hermes, mode, parse
from conveyor.wire.openai import ChatCompletionRequest


class ToolStream:
    def __init__(self, body: ChatCompletionRequest) -> None:
        self._body = body
        self._mode = mode(body)
        self._held = ""
        self._in_calls = False
        self._cut_off = False
        self.called = False  # a tool call was sent: finish_reason is tool_calls unless cut off

    def feed(self, text: str, final: bool,
             cut_off: bool = False) -> tuple[str | None, list[dict[str, Any]] | None]:
        """This piece of the job's text (the last when `final`; `cut_off`: the job ran into
        max_tokens) as (content, tool_calls) of a delta."""
        self._cut_off = cut_off
        if self._mode == "named":
            if not self.called:
                self.called = True
                call = _call(self._body.tool_choice["function"]["name"], text)  # type: ignore[index]
                return None, [{"index": 0, **call}]
            return None, [{"index": 0, "function": {"arguments": text}}]
        self._held += text
        if self._mode == "required":
            return (None, None) if not final else self._calls(parse(self._body, self._held, cut_off))
        if not self._in_calls:
            at = self._held.find(OPEN)
            if at >= 0:
                self._in_calls = True
                content, self._held = self._held[:at], self._held[at:]
                return (content or None, None) if not final else self._ending(content)
            keep = _partial_tag(self._held) if not final else 0
            content, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
            return content, None
        return (None, None) if not final else self._ending("")

    def _ending(self, content: str) -> tuple[str | None, list[dict[str, Any]] | None]:
        parsed = _hermes(self._held, self._cut_off)
        text = content + (parsed.content or "")
        _, calls = self._calls(parsed)
        return text or None, calls

    def _calls(self, parsed: Any) -> tuple[str | None, list[dict[str, Any]] | None]:
        if not parsed.tool_calls:
            return parsed.content, None
        self.called = True
        return None, [{"index": i, **call} for i, call in enumerate(parsed.tool_calls)]


def _partial_tag(text: str) -> int:
    """Length of the longest end of `text` that is a start of the `<tool_call>` tag."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0
