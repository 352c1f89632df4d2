"""OpenAI's Python client, unchanged, against the real api + worker (tiny model)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.api.conftest import auth

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
GREEDY = {"temperature": 0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}


def client(service, key: str = "key-alice") -> openai.OpenAI:  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=service.base_url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_chat_completion_streamed_and_not_agree(tiny_service) -> None:  # type: ignore[no-untyped-def]
    c = client(tiny_service)
    whole = c.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)
    [choice] = whole.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert whole.usage.completion_tokens == 8
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 8
    assert whole.id.startswith("chatcmpl-") and whole.object == "chat.completion"

    chunks = list(c.chat.completions.create(model="tiny", messages=MESSAGES, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks)
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert "".join(ch.choices[0].delta.content or "" for ch in text_chunks) == choice.message.content
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(ch.choices[0].finish_reason is None for ch in text_chunks[:-1])
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 8
    assert all(ch.usage is None for ch in text_chunks)


def test_chat_stream_without_usage_has_no_usage_chunk(tiny_service) -> None:  # type: ignore[no-untyped-def]
    chunks = list(client(tiny_service).chat.completions.create(model="tiny", messages=MESSAGES, stream=True,
                                                               **GREEDY))
    assert len(chunks) == 8 and all(ch.choices for ch in chunks)


def test_chat_logprobs(tiny_service) -> None:  # type: ignore[no-untyped-def]
    whole = client(tiny_service).chat.completions.create(model="tiny", messages=MESSAGES, logprobs=True,
                                                         top_logprobs=2, **GREEDY)
    content = whole.choices[0].logprobs.content
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_completions_streamed_and_not_agree(tiny_service) -> None:  # type: ignore[no-untyped-def]
    c = client(tiny_service)
    whole = c.completions.create(model="tiny", prompt="Once upon a time", logprobs=1, **GREEDY)
    [choice] = whole.choices
    assert whole.object == "text_completion" and choice.finish_reason == "length"
    assert "".join(choice.logprobs.tokens) == choice.text
    chunks = list(c.completions.create(model="tiny", prompt="Once upon a time", stream=True,
                                       stream_options={"include_usage": True}, **GREEDY))
    assert "".join(ch.choices[0].text for ch in chunks[:-1]) == choice.text
    assert chunks[-1].usage.completion_tokens == 8
    echoed = c.completions.create(model="tiny", prompt="Once upon a time", echo=True, **GREEDY)
    assert echoed.choices[0].text == "Once upon a time" + choice.text


def test_completion_of_token_ids(tiny_service) -> None:  # type: ignore[no-untyped-def]
    whole = client(tiny_service).completions.create(model="tiny", prompt=[1, 2, 3, 4], **GREEDY)
    assert whole.usage.prompt_tokens == 4


def test_models(tiny_service) -> None:  # type: ignore[no-untyped-def]
    c = client(tiny_service)
    [model] = c.models.list().data
    assert c.models.retrieve(model.id).id == model.id
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("no-such-model")


def test_errors_are_openai_objects_naming_the_param(tiny_service) -> None:  # type: ignore[no-untyped-def]
    c = client(tiny_service)
    with pytest.raises(openai.UnprocessableEntityError) as err:
        c.chat.completions.create(model="tiny", messages=MESSAGES, temperature=3)
    assert err.value.body["param"] == "temperature"
    assert "less than or equal to 2" in err.value.body["message"]
    with pytest.raises(openai.UnprocessableEntityError) as err:
        c.chat.completions.create(model="tiny", messages=MESSAGES, n=9)  # past max_best_of
    assert err.value.body["param"] == "n"
    with pytest.raises(openai.AuthenticationError) as auth_err:
        client(tiny_service, key="wrong").chat.completions.create(model="tiny", messages=MESSAGES)
    assert auth_err.value.body["code"] == "invalid_api_key"


def test_malformed_json_is_400_in_openai_shape(tiny_service) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(tiny_service.base_url + "/v1/chat/completions", content=b"{nope",
                   headers={**auth("alice"), "Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "JSON" in error["message"]
