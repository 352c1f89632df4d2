"""LiteLLM's `openai/` and `hosted_vllm/` providers: chat, streaming, async, `response_format`,
tool calls (named, required, auto)."""

from __future__ import annotations

import asyncio
import json

import litellm
import pytest
from conftest import MAX_TOKENS, Service, no_call_json, quality_miss
from shapes import CITY_PROMPT, QUESTION, WEATHER_PROMPT, WEATHER_TOOL, City

PROVIDERS = ["openai", "hosted_vllm"]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def ask(conveyor: Service, provider: str, content: str = QUESTION, max_tokens: int = MAX_TOKENS,  # type: ignore[no-untyped-def]
        **kwargs: object):
    return litellm.completion(model=f"{provider}/{conveyor.model}", api_base=conveyor.v1, api_key="unused",
                              messages=[{"role": "user", "content": content}], max_tokens=max_tokens,
                              temperature=0, **kwargs)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_chat_stream_async(conveyor: Service, provider: str) -> None:
    answer = ask(conveyor, provider)
    assert answer.choices[0].message.content and answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.completion_tokens > 0
    chunks = list(ask(conveyor, provider, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert any(c.choices and c.choices[0].finish_reason in ("stop", "length") for c in chunks)
    messages = [{"role": "user", "content": QUESTION}]
    later = asyncio.run(litellm.acompletion(model=f"{provider}/{conveyor.model}", api_base=conveyor.v1,
                                            api_key="unused", messages=messages, max_tokens=MAX_TOKENS))
    assert later.choices[0].message.content


@pytest.mark.parametrize("provider", PROVIDERS)
def test_response_format_json_schema(conveyor: Service, provider: str) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "city", "schema": City.model_json_schema(),
                                                     "strict": True}}
    answer = ask(conveyor, provider, CITY_PROMPT, response_format=schema)
    assert answer.choices[0].finish_reason == "stop"
    City.model_validate_json(answer.choices[0].message.content)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
def test_forced_tool_calls(conveyor: Service, provider: str, tool_choice: object) -> None:
    answer = ask(conveyor, provider, WEATHER_PROMPT, tools=[WEATHER_TOOL], tool_choice=tool_choice,
                 parallel_tool_calls=False, max_tokens=96)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Lima", "Oslo")
    no_call_json(choice.message.content)


def test_auto_tool_choice(conveyor: Service) -> None:
    choice = ask(conveyor, "openai", WEATHER_PROMPT, tools=[WEATHER_TOOL]).choices[0]
    no_call_json(choice.message.content)
    if not choice.message.tool_calls:
        quality_miss("no tool call under tool_choice auto")
    assert choice.finish_reason in ("tool_calls", "length")


def test_a_call_cut_off_by_max_tokens_is_length(conveyor: Service) -> None:
    choice = ask(conveyor, "openai", WEATHER_PROMPT, tools=[WEATHER_TOOL], max_tokens=3,
                 tool_choice=NAMED).choices[0]
    assert choice.finish_reason == "length"
