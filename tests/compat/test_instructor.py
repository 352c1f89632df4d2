"""instructor: a response model through each mode that OpenAI-compatible servers take (tools,
strict tools, JSON schema, JSON), partial streaming, async."""

from __future__ import annotations

import asyncio

import instructor
import pytest
from conftest import MAX_TOKENS, Service, quality_miss
from instructor.core.exceptions import IncompleteOutputException, InstructorRetryException
from openai import AsyncOpenAI, OpenAI
from shapes import CITY_PROMPT, City

ASK = {"response_model": City, "messages": [{"role": "user", "content": CITY_PROMPT}],
       "max_tokens": MAX_TOKENS, "max_retries": 0}


def client(conveyor: Service, mode: instructor.Mode) -> instructor.Instructor:
    return instructor.from_openai(OpenAI(base_url=conveyor.v1, api_key="unused", max_retries=0, timeout=120),
                                  mode=mode)


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.TOOLS_STRICT,
                                  instructor.Mode.JSON_SCHEMA], ids=lambda m: m.value)
def test_modes_enforced_by_a_grammar(conveyor: Service, mode: instructor.Mode) -> None:
    city = client(conveyor, mode).chat.completions.create(
        model=conveyor.model, **ASK)
    assert isinstance(city, City)


def test_json_mode(conveyor: Service) -> None:
    """json_object and the schema in the prompt: a City only if the model writes one."""
    try:
        city = client(conveyor, instructor.Mode.JSON).chat.completions.create(
            model=conveyor.model, **ASK)
    except (InstructorRetryException, IncompleteOutputException) as exc:  # not a City, or no end to it
        quality_miss(f"JSON mode: not a City ({type(exc).__name__}: {exc})")
    assert isinstance(city, City)


def test_partial_streaming(conveyor: Service) -> None:
    partials = list(client(conveyor, instructor.Mode.TOOLS).chat.completions.create_partial(
        model=conveyor.model, **ASK))
    assert partials and City.model_validate(partials[-1].model_dump())


def test_async(conveyor: Service) -> None:
    async def run() -> list[City]:
        aclient = instructor.from_openai(AsyncOpenAI(base_url=conveyor.v1, api_key="unused", max_retries=0),
                                         mode=instructor.Mode.TOOLS)
        return await asyncio.gather(*(aclient.chat.completions.create(
            model=conveyor.model, **ASK)
            for _ in range(3)))

    assert all(isinstance(c, City) for c in asyncio.run(run()))
