"""The official clients, unchanged, on the real default model where the text matters."""

from __future__ import annotations

import openai
import pytest
from text_generation import Client

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"


def test_openai_chat_says_paris_streamed_and_not(service) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": QUESTION}]
    whole = client.chat.completions.create(model="any", messages=messages, temperature=0, max_tokens=20)
    assert "Paris" in whole.choices[0].message.content
    chunks = list(client.chat.completions.create(model="any", messages=messages, temperature=0, max_tokens=20,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content


def test_openai_completion_continues_the_prompt(service) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    done = client.completions.create(model="any", prompt="The capital of France is", temperature=0,
                                     max_tokens=5)
    assert "Paris" in done.choices[0].text


def test_tgi_client_says_paris(service) -> None:  # type: ignore[no-untyped-def]
    client = Client(service.base_url, timeout=120)
    streamed = list(client.generate_stream(QUESTION, max_new_tokens=20))
    assert "Paris" in streamed[-1].generated_text
    assert client.generate(QUESTION, max_new_tokens=20).generated_text == streamed[-1].generated_text


def test_open_access_is_announced(service) -> None:  # type: ignore[no-untyped-def]
    assert "no API keys configured: the api is open" in service.logs()
