"""TGI's own Python client (`text_generation`), unchanged, against the real api + worker."""

from __future__ import annotations

import httpx
import pytest
from text_generation import AsyncClient, Client
from text_generation.errors import ValidationError

from tests.api.conftest import auth

PROMPT = "Tell me a story about a robot"


def client(service, tenant: str = "alice") -> Client:  # type: ignore[no-untyped-def]
    return Client(service.base_url, headers=auth(tenant), timeout=60)


def test_generate_with_details(tiny_service) -> None:  # type: ignore[no-untyped-def]
    response = client(tiny_service).generate(PROMPT, max_new_tokens=6, decoder_input_details=False)
    details = response.details
    assert details.generated_tokens == len(details.tokens) <= 6
    assert details.finish_reason.value in ("length", "eos_token")
    text = "".join(t.text for t in details.tokens if not t.special)
    assert response.generated_text == text


def test_generate_stream_ends_with_the_whole_text(tiny_service) -> None:  # type: ignore[no-untyped-def]
    responses = list(client(tiny_service).generate_stream(PROMPT, max_new_tokens=8, top_n_tokens=2))
    assert [r.token.id for r in responses] and len(responses) <= 8
    assert all(len(r.top_tokens) == 2 for r in responses)
    final = responses[-1]
    assert final.details is not None and final.details.generated_tokens == len(responses)
    assert final.generated_text == "".join(r.token.text for r in responses if not r.token.special)
    assert all(r.generated_text is None for r in responses[:-1])


async def test_async_client_generate_and_stream_agree(tiny_service) -> None:  # type: ignore[no-untyped-def]
    async_client = AsyncClient(tiny_service.base_url, headers=auth("alice"), timeout=60)
    whole = await async_client.generate(PROMPT, max_new_tokens=8)  # greedy: the same tokens each time
    streamed = [r async for r in async_client.generate_stream(PROMPT, max_new_tokens=8)]
    assert [t.id for t in whole.details.tokens] == [r.token.id for r in streamed]
    assert streamed[-1].generated_text == whole.generated_text


def test_same_seed_same_sample(tiny_service) -> None:  # type: ignore[no-untyped-def]
    c = client(tiny_service)
    a = c.generate(PROMPT, max_new_tokens=8, do_sample=True, seed=7, temperature=1.5)
    b = c.generate(PROMPT, max_new_tokens=8, do_sample=True, seed=7, temperature=1.5)
    assert a.details.seed == 7
    assert [t.id for t in a.details.tokens] == [t.id for t in b.details.tokens]


def test_compat_route_defaults_to_the_full_text_as_tgi(tiny_service) -> None:  # type: ignore[no-untyped-def]
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 3}}
    r = httpx.post(tiny_service.base_url + "/", json=body, headers=auth("alice"), timeout=60)
    assert r.status_code == 200, r.text
    [answer] = r.json()
    assert answer["generated_text"].startswith(PROMPT)
    r = httpx.post(tiny_service.base_url + "/generate", json=body, headers=auth("alice"), timeout=60)
    assert not r.json()["generated_text"].startswith(PROMPT)


def test_client_sees_validation_errors(tiny_service) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError, match="top_n_tokens"):
        client(tiny_service).generate(PROMPT, max_new_tokens=2, top_n_tokens=50)


def test_without_a_key_is_401_in_tgi_shape(tiny_service) -> None:  # type: ignore[no-untyped-def]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        url = tiny_service.base_url + "/generate"
        r = httpx.post(url, json={"inputs": "hi"}, headers=headers, timeout=30)
        assert r.status_code == 401, r.text
        assert r.json()["error_type"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
