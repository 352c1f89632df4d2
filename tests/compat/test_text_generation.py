"""TGI's own client (`text-generation`): generate, generate_stream, chat streamed and not (it
requires `delta.role` in every chunk), a required tool call, the async client."""

from __future__ import annotations

import asyncio

from conftest import MAX_TOKENS, Service, no_call_json
from shapes import QUESTION, WEATHER_PROMPT, WEATHER_TOOL
from text_generation import AsyncClient, Client
from text_generation.types import Message, Tool

MESSAGES = [Message(role="user", content=QUESTION)]


def test_generate_and_stream(conveyor: Service) -> None:
    client = Client(conveyor.base_url, timeout=120)
    answer = client.generate(QUESTION, max_new_tokens=MAX_TOKENS)
    assert answer.details.finish_reason.value in ("length", "eos_token", "stop_sequence")
    streamed = list(client.generate_stream(QUESTION, max_new_tokens=MAX_TOKENS))
    assert streamed[-1].generated_text == answer.generated_text  # greedy


def test_chat_whole_and_streamed(conveyor: Service) -> None:
    client = Client(conveyor.base_url, timeout=120)
    whole = client.chat(messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    assert whole.choices[0].message.content and whole.choices[0].finish_reason in ("stop", "length")
    text = ""
    # Up to the finish: this client cannot parse the `data: [DONE]` that ends an OpenAI stream.
    for chunk in client.chat(messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True):
        assert chunk.choices[0].delta.role == "assistant"
        text += chunk.choices[0].delta.content or ""
        if chunk.choices[0].finish_reason:
            break
    assert text


def test_chat_required_tool_call(conveyor: Service) -> None:
    tool = Tool(type="function", function=WEATHER_TOOL["function"])
    answer = Client(conveyor.base_url, timeout=120).chat(
        messages=[Message(role="user", content=WEATHER_PROMPT)], tools=[tool], tool_choice="required",
        max_tokens=96, temperature=0)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    assert choice.message.tool_calls[0]["function"]["name"] == "get_weather"
    no_call_json(choice.message.content)


def test_async_client(conveyor: Service) -> None:
    async def run() -> list[str]:
        client = AsyncClient(conveyor.base_url, timeout=120)
        answers = await asyncio.gather(*(client.generate(q, max_new_tokens=MAX_TOKENS)
                                         for q in (QUESTION, "Name a colour.")))
        return [a.generated_text for a in answers]

    assert len(asyncio.run(run())) == 2
