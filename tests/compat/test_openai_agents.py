"""The OpenAI Agents SDK on the chat completions API: a named tool called, executed and fed back
before the final answer, `output_type` (a JSON schema), a streamed run."""

from __future__ import annotations

import asyncio

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallItem, ToolCallOutputItem
from conftest import MAX_TOKENS, Service, no_call_json, quality_miss
from openai import AsyncOpenAI
from shapes import CITY_PROMPT, QUESTION, WEATHER_PROMPT, City, get_weather

set_tracing_disabled(True)


def model(conveyor: Service) -> OpenAIChatCompletionsModel:
    client = AsyncOpenAI(base_url=conveyor.v1, api_key="unused", max_retries=0, timeout=120)
    return OpenAIChatCompletionsModel(model=conveyor.model, openai_client=client)


def test_a_named_tool_executed_and_fed_back(conveyor: Service) -> None:
    settings = ModelSettings(tool_choice="get_weather", max_tokens=MAX_TOKENS, temperature=0)
    agent = Agent(name="weather", instructions="Answer with the weather the tool gives.",
                  model=model(conveyor), tools=[function_tool(get_weather)], model_settings=settings)
    try:  # after the call the SDK resets tool_choice to auto: the model may keep calling
        result = Runner.run_sync(agent, WEATHER_PROMPT, max_turns=3)
    except MaxTurnsExceeded:
        quality_miss("the model kept calling the tool under auto")
    kinds = [type(item) for item in result.new_items]
    assert ToolCallItem in kinds and ToolCallOutputItem in kinds, kinds
    assert isinstance(result.final_output, str)
    no_call_json(result.final_output)


def test_output_type(conveyor: Service) -> None:
    agent = Agent(name="cities", model=model(conveyor), output_type=City,
                  model_settings=ModelSettings(max_tokens=96, temperature=0))
    assert isinstance(Runner.run_sync(agent, CITY_PROMPT).final_output, City)


def test_streamed_run(conveyor: Service) -> None:
    agent = Agent(name="plain", model=model(conveyor), model_settings=ModelSettings(max_tokens=MAX_TOKENS))

    async def run() -> str:
        result = Runner.run_streamed(agent, QUESTION)
        async for _ in result.stream_events():
            pass
        return str(result.final_output)

    assert asyncio.run(run())
