"""OpenAI tool calling on chat completions: `tools` / `tool_choice` → the prompt and the grammar of
a job, and the job's text → `message.tool_calls`.

The model's own format is Hermes' (what Qwen2.5, Hermes and most tool-aware templates use): each
call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. A template that uses `tools`
renders them itself (`tools=`); for one that does not (SmolLM2's), the tools are described in the
system message in that format. `tool_choice`:
- `none`: the tools are in the prompt (as OpenAI and vLLM), the output is plain content;
- `auto` (the default with tools): the output's `<tool_call>` blocks become `tool_calls`, the text
  around them `content`; a block that does not parse stays content;
- `required`: a grammar makes the output a JSON array of `{"name", "arguments"}`, one of the tools'
  each, arguments valid for that tool's `parameters` (at most one call when
  `parallel_tool_calls` is false);
- a named function: a grammar makes the output that function's `arguments` (its `parameters`).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from conveyor.api.errors import ValidationError
from conveyor.api.requests.grammar import checked, json_schema
from conveyor.settings import Settings
from conveyor.wire.grammar import GrammarSpec
from conveyor.wire.openai import ChatCompletionRequest

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def mode(body: ChatCompletionRequest) -> str:
    """none | auto | required | named (no tools: none). Validated by `grammar_for`."""
    choice = body.tool_choice
    if not body.tools:
        return "none"
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else "named"


def _functions(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(body.tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type") != "function":
            raise ValidationError(f'`tools.{i}`: a tool is {{"type": "function", "function": {{...}}}}',
                                  param=f"tools.{i}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValidationError(f"`tools.{i}.function.name` is required (a string)",
                                  param=f"tools.{i}.function.name")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise ValidationError(f"`tools.{i}.function.parameters` is a JSON schema (an object)",
                                  param=f"tools.{i}.function.parameters")
        out.append({**fn, "parameters": params})
    return out


def grammar_for(settings: Settings, body: ChatCompletionRequest) -> GrammarSpec | None:
    """The grammar `tool_choice` imposes (required, named), after checking tools and tool_choice."""
    if body.tool_choice is not None and not body.tools:
        raise ValidationError("`tool_choice` is only allowed when `tools` are given", param="tool_choice")
    functions = _functions(body)
    choice, kind = body.tool_choice, mode(body)
    if kind == "named":
        fn = choice.get("function") if isinstance(choice, dict) else None
        match = [f for f in functions if isinstance(fn, dict) and f["name"] == fn.get("name")]
        if not isinstance(choice, dict) or choice.get("type") != "function" or not match:
            names = ", ".join(f["name"] for f in functions)
            raise ValidationError(f'`tool_choice`: {{"type": "function", "function": {{"name": ...}}}} with '
                                  f"one of the tools' names ({names}); given {json.dumps(choice)}",
                                  param="tool_choice")
        return checked(settings, json_schema(match[0]["parameters"], "tools"), "tools")
    if kind == "required":
        calls = [{"type": "object",
                  "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                  "required": ["name", "arguments"], "additionalProperties": False} for f in functions]
        array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not body.parallel_tool_calls:
            array["maxItems"] = 1
        return checked(settings, json_schema(array, "tools"), "tools")
    if kind not in ("auto", "none"):
        raise ValidationError(f"`tool_choice`: one of none, auto, required or a named function; "
                              f"given {choice!r}", param="tool_choice")
    return None


def template_tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    return [{"type": "function", "function": f} for f in _functions(body)] if body.tools else None


def system_text(tools: list[dict[str, Any]]) -> str:
    """The tools described for a template that does not render them (Hermes' wording)."""
    return _SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def tool_calls_in(i: int, calls: Any) -> list[dict[str, Any]]:
    """An input assistant message's `tool_calls`, checked, with `arguments` parsed (templates
    expect an object, as transformers documents)."""
    field = f"messages.{i}.tool_calls"
    out = []
    for j, call in enumerate(calls if isinstance(calls, list) else [None]):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValidationError(f'`{field}.{j}`: a call is {{"id", "type": "function", "function": '
                                  '{"name", "arguments"}}', param=field)
        arguments = fn.get("arguments", "{}")
        with contextlib.suppress(ValueError):  # not JSON: kept as the text it is
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        out.append({"id": call.get("id"), "type": "function",
                    "function": {"name": fn["name"], "arguments": arguments}})
    return out


def tool_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The conversation for a template that knows no tools: the tools described in the system
    message, earlier calls and their results written in the model's format."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = [json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                     for c in m.pop("tool_calls")]
            m["content"] = "\n".join([m["content"], *(f"{OPEN}\n{c}\n{CLOSE}" for c in calls)]).strip()
        if m["role"] == "tool":
            m["content"] = f"<tool_response>\n{m['content']}\n</tool_response>"
        out.append(m)
    if tools:
        described = system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def _call(name: str, arguments: Any) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": text}}


@dataclass(slots=True)
class Parsed:
    content: str | None
    tool_calls: list[dict[str, Any]]


def _hermes(text: str) -> Parsed:
    calls: list[dict[str, Any]] = []
    content, rest = [], text
    while (start := rest.find(OPEN)) >= 0:
        content.append(rest[:start])
        end = rest.find(CLOSE, start)
        stop = end + len(CLOSE) if end >= 0 else len(rest)
        try:
            value = json.loads(rest[start + len(OPEN): end if end >= 0 else len(rest)])
            if not isinstance(value.get("name"), str):
                raise TypeError("no name")
            calls.append(_call(value["name"], value.get("arguments", {})))
        except (ValueError, AttributeError, TypeError):
            content.append(rest[start:stop])  # not a call: it stays text
        rest = rest[stop:]
    content.append(rest)
    return Parsed("".join(content).strip() or None, calls)


def parse(body: ChatCompletionRequest, text: str) -> Parsed:
    """The job's text as the assistant message: content and tool calls, by `tool_choice`."""
    kind = mode(body)
    if kind == "named":
        return Parsed(None, [_call(body.tool_choice["function"]["name"], text)])  # type: ignore[index]
    if kind == "required":
        try:
            return Parsed(None, [_call(c["name"], c["arguments"]) for c in json.loads(text)])
        except (ValueError, KeyError, TypeError):  # cut short (max_tokens): what came, as content
            return Parsed(text, [])
    if kind == "auto" and OPEN in text:
        return _hermes(text)
    return Parsed(text, [])
