"""What every library's tests ask for: a bounded structured answer (an enum, an integer range, a
short string: a grammar ends it within max_tokens whatever the model) and one tool."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

QUESTION = "What is the capital of France? Answer in a few words."
CITY_PROMPT = "Describe Paris: its country, its name and its population in millions."
WEATHER_PROMPT = "What is the weather in Paris?"


class City(BaseModel):
    """A city."""

    name: str = Field(max_length=12)
    country: Literal["France", "Peru", "Norway"]
    population_millions: int = Field(ge=0, le=40)


def get_weather(city: Literal["Paris", "Lima", "Oslo"]) -> str:
    """The weather in a city."""
    return f"Sunny and 21 °C in {city}."


WEATHER_SCHEMA = {"type": "object", "required": ["city"], "additionalProperties": False,
                  "properties": {"city": {"type": "string", "enum": ["Paris", "Lima", "Oslo"]}}}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER_SCHEMA}}
