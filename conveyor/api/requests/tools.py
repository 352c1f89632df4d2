"""OpenAI tool calling on chat completions: `tools` / `tool_choice` → the prompt and the grammar of
a job, and the job's text → `message.tool_calls`.

The model's own format is Hermes' (what Qwen2.5, Hermes and most tool-aware templates use): each
call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. A template that uses `tools`
renders them itself (`tools=`); for one that does not (SmolLM2's), the tools are described in the
system message in that format. `tool_choice`:
- `none`: the tools are in the prompt (as OpenAI and vLLM), the output is plain content;
- `auto` (the default with tools): the output's `<tool_call>` blocks become `tool_calls`, the text
  around them `content`; a block that does not parse stays content;
- `required`: a grammar makes the output one or more `<tool_call>` blocks in the model's format,
  each `{"name", "arguments"}` of one of the tools, arguments valid for its `parameters` (one block
  when `parallel_tool_calls` is false). The output may end after any complete block, so a model
  that repeats calls until `max_tokens` still answers the complete ones;
- a named function: a grammar makes the output that function's `arguments` (its `parameters`).

Output cut off by `max_tokens` answers `finish_reason: length`, never `tool_calls` (as OpenAI and
vLLM): a cut-off call is never complete. Call JSON is never content: under `required` nothing but
the calls is, and under `auto` a cut-off last block is dropped.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from conveyor.api.errors import ValidationError
from conveyor.api.requests.grammar import checked, json_schema, parsed_schema
from conveyor.settings import Settings
from conveyor.wire.grammar import JSON_OPTIONS, GrammarSpec
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
        return json_schema(settings, match[0]["parameters"], "tools")
    if kind == "required":
        return _required_grammar(settings, functions, body.parallel_tool_calls)
    if kind not in ("auto", "none"):
        raise ValidationError(f"`tool_choice`: one of none, auto, required or a named function; "
                              f"given {choice!r}", param="tool_choice")
    return None


def _required_grammar(settings: Settings, functions: list[dict[str, Any]], parallel: bool) -> GrammarSpec:
    """One or more `<tool_call>` blocks (one if not `parallel`), each a call of one of the functions;
    the grammar accepts the end of the output after any complete block."""
    calls = [{"type": "object", "properties": {
        "name": {"const": f["name"]},
        "arguments": parsed_schema(settings, f["parameters"], f"tools.{i}.function.parameters")},
        "required": ["name", "arguments"], "additionalProperties": False} for i, f in enumerate(functions)]
    schema = json.dumps({"anyOf": calls, "x-guidance": JSON_OPTIONS}, ensure_ascii=False)
    block = f'"{OPEN}\\n" %json {schema} "\\n{CLOSE}"'
    more = ' ("\\n" call)*' if parallel else ""
    lark = f"start: call{more}\ncall: {block}\n"
    return checked(settings, GrammarSpec(kind="lark", value=lark), "tools")


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


def check_replies(messages: list[dict[str, Any]]) -> None:
    """As OpenAI: an assistant message with `tool_calls` is followed by `tool` messages answering
    each call (by `tool_call_id`); else a 422 naming that message's `tool_calls`."""
    for i, m in enumerate(messages):
        if not m.get("tool_calls"):
            continue
        replies = []
        for reply in messages[i + 1:]:
            if reply["role"] != "tool":
                break
            replies.append(reply.get("tool_call_id"))
        unanswered = [c["id"] for c in m["tool_calls"] if c["id"] is not None and c["id"] not in replies]
        if not replies or unanswered:
            ids = ", ".join(unanswered) or "its calls"
            raise ValidationError(f"`messages.{i}.tool_calls`: an assistant message with tool calls must be "
                                  f"followed by tool messages answering each (tool_call_id); none answers "
                                  f"{ids}", param=f"messages.{i}.tool_calls")


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


def _hermes(text: str, cut_off: bool = False) -> Parsed:
    """Each `<tool_call>` block that parses is a call, the rest content; with `cut_off` (the output
    ran into max_tokens), an unclosed last block is a call cut short, dropped."""
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
            if end >= 0 or not cut_off:
                content.append(rest[start:stop])  # not a call: it stays text
        rest = rest[stop:]
    content.append(rest)
    return Parsed("".join(content).strip() or None, calls)


def parse(body: ChatCompletionRequest, text: str, cut_off: bool = False) -> Parsed:
    """The job's text as the assistant message: content and tool calls, by `tool_choice`. `cut_off`:
    the text ran into max_tokens."""
    kind = mode(body)
    if kind == "named":
        return Parsed(None, [_call(body.tool_choice["function"]["name"], text)])  # type: ignore[index]
    if kind == "required":  # the grammar allows nothing but calls: a cut-off one is dropped
        return Parsed(None, _hermes(text, cut_off=True).tool_calls)
    if kind == "auto" and OPEN in text:
        return _hermes(text, cut_off)
    return Parsed(text, [])


def finish_reason(calls: bool, ended: str) -> str:
    """OpenAI's finish_reason of a chat choice that ended `ended` (stop or length), with or without
    tool calls: cut off is `length` whatever was called."""
    return "tool_calls" if calls and ended == "stop" else ended
