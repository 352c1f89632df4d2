"""LangChain's ChatOpenAI: invoke, stream, batch, async, `with_structured_output` in each of its
methods, tool calls (named, required, auto) with a round trip, and a call cut off by max_tokens."""

from __future__ import annotations

import asyncio

import pytest
from conftest import MAX_TOKENS, Service, no_call_json, quality_miss
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from shapes import CITY_PROMPT, QUESTION, WEATHER_PROMPT, City
from shapes import get_weather as weather

get_weather = tool(weather)  # its argument is an enum: a forced call ends within max_tokens


def chat(conveyor: Service, max_tokens: int = MAX_TOKENS) -> ChatOpenAI:
    return ChatOpenAI(base_url=conveyor.v1, api_key="unused", model=conveyor.model,  # type: ignore[arg-type]
                      max_tokens=max_tokens, temperature=0, max_retries=0, timeout=120)


def test_invoke_stream_batch_async(conveyor: Service) -> None:
    llm = chat(conveyor)
    answer = llm.invoke(QUESTION)
    assert isinstance(answer.content, str) and answer.content
    assert answer.response_metadata["finish_reason"] in ("stop", "length")
    assert answer.usage_metadata and answer.usage_metadata["output_tokens"] > 0
    chunks = list(llm.stream(QUESTION))
    assert "".join(str(c.content) for c in chunks)
    answers = llm.batch([QUESTION, "Name a colour.", "Say hello."])
    assert len(answers) == 3 and all(isinstance(a.content, str) for a in answers)
    assert asyncio.run(llm.ainvoke(QUESTION)).content


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_through_the_grammar(conveyor: Service, method: str) -> None:
    """Both methods are enforced by a grammar (response_format json_schema, a named tool)."""
    city = chat(conveyor).with_structured_output(City, method=method).invoke(CITY_PROMPT)  # type: ignore[arg-type]
    assert isinstance(city, City)


def test_structured_output_json_mode(conveyor: Service) -> None:
    """json_object: any JSON object; whether it is a City is the model's doing."""
    structured = chat(conveyor).with_structured_output(City, method="json_mode", include_raw=True)
    out = structured.invoke(CITY_PROMPT + " Answer in JSON with keys name, country, population_millions.")
    assert isinstance(out["raw"], AIMessage)  # type: ignore[index]
    if out["parsing_error"] is not None:  # type: ignore[index]
        quality_miss(f"json_mode output is not a City: {out['raw'].content!r}")  # type: ignore[index]


def test_named_and_required_tool_calls_with_a_round_trip(conveyor: Service) -> None:
    for tool_choice in ("get_weather", "any"):  # "any" is OpenAI's "required"
        llm = chat(conveyor, max_tokens=96).bind_tools([get_weather], tool_choice=tool_choice)
        message = llm.invoke(WEATHER_PROMPT)
        assert not message.invalid_tool_calls and message.tool_calls, message
        assert all(c["name"] == "get_weather" and c["args"]["city"] in ("Paris", "Lima", "Oslo")
                   for c in message.tool_calls)
        no_call_json(str(message.content))
        # A named call ends with its arguments; `required` may repeat calls until max_tokens.
        ended = ("tool_calls",) if tool_choice == "get_weather" else ("tool_calls", "length")
        assert message.response_metadata["finish_reason"] in ended, message
    replies = [ToolMessage(get_weather.invoke(c["args"]), tool_call_id=c["id"]) for c in message.tool_calls]
    final = chat(conveyor).bind_tools([get_weather]).invoke([HumanMessage(WEATHER_PROMPT), message, *replies])
    assert final.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")
    no_call_json(str(final.content))


def test_auto_tool_choice(conveyor: Service) -> None:
    message = chat(conveyor).bind_tools([get_weather]).invoke(WEATHER_PROMPT)
    no_call_json(str(message.content))
    assert not message.invalid_tool_calls or message.response_metadata["finish_reason"] == "length"
    if not message.tool_calls:
        quality_miss("no tool call under tool_choice auto")
    assert message.response_metadata["finish_reason"] in ("tool_calls", "length")


def test_a_call_cut_off_by_max_tokens_is_length(conveyor: Service) -> None:
    """Not `tool_calls` with arguments that do not parse: LangChain keeps them as invalid calls."""
    llm = chat(conveyor, max_tokens=3).bind_tools([get_weather], tool_choice="get_weather")
    message = llm.invoke(WEATHER_PROMPT)
    assert message.response_metadata["finish_reason"] == "length" and not message.tool_calls
