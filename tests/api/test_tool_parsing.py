"""`tool_choice: auto` output parsing (Hermes' <tool_call> blocks) and its streaming, as pure logic:
the tiny random model never writes a tool call of its own."""

from __future__ import annotations

import json

import pytest

from conveyor.api.requests.tools import parse, tool_messages
from conveyor.api.responses.tool_stream import ToolStream, _partial_tag
from conveyor.wire.openai import ChatCompletionRequest

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
BODY = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS)  # type: ignore[list-item]
OUTPUT = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
          '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>')


def test_auto_parses_each_block_and_keeps_the_text_around() -> None:
    parsed = parse(BODY, OUTPUT)
    assert parsed.content == "Let me check."
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [{"city": "Paris"},
                                                                                  {"city": "Lima"}]
    assert all(c["function"]["name"] == "get_weather" and c["type"] == "function" for c in parsed.tool_calls)
    assert len({c["id"] for c in parsed.tool_calls}) == 2


@pytest.mark.parametrize("text", ["no call here", "<tool_call>{not json</tool_call>",
                                  "<tool_call>[1]</tool_call>", '<tool_call>{"arguments": {}}'])
def test_auto_text_that_is_no_call_stays_content(text: str) -> None:
    parsed = parse(BODY, text)
    assert parsed.tool_calls == [] and parsed.content == text


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_auto_stream_reassembles_whatever_the_pieces(size: int) -> None:
    stream = ToolStream(BODY)
    pieces = [OUTPUT[i:i + size] for i in range(0, len(OUTPUT), size)]
    content, calls = "", []
    for i, piece in enumerate(pieces):
        text, deltas = stream.feed(piece, i == len(pieces) - 1)
        content += text or ""
        calls += deltas or []
        assert "<" not in (text or "")  # never a piece of the tag as content
    assert content.strip() == "Let me check." and stream.called
    assert [c["index"] for c in calls] == [0, 1] and calls[1]["function"]["arguments"] == '{"city": "Lima"}'


def test_auto_stream_without_a_call_is_all_content() -> None:
    stream = ToolStream(BODY)
    out = [stream.feed(p, final) for p, final in (("a <tool", False), ("s> b <", False), ("x", True))]
    assert "".join(t or "" for t, _ in out) == "a <tools> b <x" and not stream.called
    assert _partial_tag("ab <tool_") == len("<tool_") and _partial_tag("abc") == 0


def test_tools_described_in_the_system_message_for_a_template_without_tools() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"c": 1}}}]},
                {"role": "tool", "content": "sunny", "tool_call_id": "1"}]
    out = tool_messages(messages, TOOLS)
    assert out[0]["content"].startswith("Be brief.") and '"name": "get_weather"' in out[0]["content"]
    assert "<tools>" in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"c": 1}}\n</tool_call>'
    assert "tool_calls" not in out[2] and out[3]["content"] == "<tool_response>\nsunny\n</tool_response>"
