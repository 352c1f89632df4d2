"""pydantic-ai with its OpenAI chat model: text, streamed text, structured output as a tool (the
default), native (`response_format`) and prompted, and a function tool whose result is fed back."""

from __future__ import annotations

import asyncio

import pytest
from conftest import MAX_TOKENS, Service, quality_miss
from pydantic_ai import Agent, NativeOutput, PromptedOutput
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from shapes import CITY_PROMPT, QUESTION, City, get_weather


def agent(conveyor: Service, output_type: object = str, max_tokens: int = MAX_TOKENS,
          **kwargs: object) -> Agent:
    model = OpenAIChatModel(conveyor.model, provider=OpenAIProvider(base_url=conveyor.v1, api_key="unused"))
    return Agent(model, output_type=output_type, retries=1,  # type: ignore[arg-type]
                 model_settings=ModelSettings(max_tokens=max_tokens, temperature=0), **kwargs)  # type: ignore[arg-type]


def test_text_and_streamed_text(conveyor: Service) -> None:
    assert agent(conveyor).run_sync(QUESTION).output

    async def streamed() -> list[str]:
        async with agent(conveyor).run_stream(QUESTION) as result:
            return [piece async for piece in result.stream_text(delta=True)]

    assert "".join(asyncio.run(streamed()))


@pytest.mark.parametrize("output", ["tool", "native"])
def test_structured_output_through_the_grammar(conveyor: Service, output: str) -> None:
    """A tool output is a `required` tool call, a native one `response_format`: both grammars."""
    output_type = City if output == "tool" else NativeOutput(City)
    assert isinstance(agent(conveyor, output_type, max_tokens=96).run_sync(CITY_PROMPT).output, City)


def test_prompted_output(conveyor: Service) -> None:
    try:
        city = agent(conveyor, PromptedOutput(City), max_tokens=96).run_sync(CITY_PROMPT).output
    except UnexpectedModelBehavior as exc:
        quality_miss(f"prompted output is not a City ({exc})")
    assert isinstance(city, City)


def test_a_function_tool_round_trip(conveyor: Service) -> None:
    """The tool and the output tool are both offered (tool_choice required): a call of get_weather
    is executed and its result sent back before the City comes."""
    result = agent(conveyor, City, max_tokens=96, tools=[get_weather]).run_sync(
        "Look up the weather in Paris, then describe Paris.")
    assert isinstance(result.output, City)
    returned = [p for m in result.all_messages() for p in getattr(m, "parts", [])
                if isinstance(p, ToolReturnPart) and p.tool_name == "get_weather"]
    if not returned:
        quality_miss("the model went to the answer without calling get_weather")
