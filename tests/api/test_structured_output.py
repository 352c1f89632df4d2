"""Structured output through the real api + worker (tiny random model: the grammar alone makes the
output valid): OpenAI `response_format` (json_schema, json_object) and TGI `grammar` (json, regex),
sampled and greedy, streamed and not."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema

from tests.api.conftest import auth
from tests.api.sse import events

# Bounded everywhere (string lengths, an integer range, an enum, at most two items): a document ends
# within max_tokens whatever the model, so finish_reason must be "stop" every time.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["name", "age", "pet", "tags"],
    "additionalProperties": False,
}
MSG = [{"role": "user", "content": "Describe a person as JSON."}]


async def _chat(client: httpx.AsyncClient, seed: int) -> dict:
    r = await client.post("/v1/chat/completions", json={
        "messages": MSG, "max_tokens": 400, "temperature": 1.0, "top_p": 0.95, "seed": seed,
        "frequency_penalty": 0.3,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                                    "strict": True}}})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_json_schema_holds_in_50_seeded_sampled_runs(tiny_service) -> None:  # type: ignore[no-untyped-def]
    async def run() -> list[dict]:
        async with httpx.AsyncClient(base_url=tiny_service.base_url, headers=auth("alice"), timeout=300) as c:
            return await asyncio.gather(*(_chat(c, seed) for seed in range(50)))

    choices = asyncio.run(run())
    contents = []
    for choice in choices:
        assert choice["finish_reason"] == "stop", choice
        value = json.loads(choice["message"]["content"])
        jsonschema.validate(value, SCHEMA)
        contents.append(choice["message"]["content"])
    assert len(set(contents)) > 10  # sampled: the seeds give different documents


def test_json_object_and_completions_regex(tiny_service) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(tiny_service.base_url + "/v1/chat/completions", headers=auth("alice"), timeout=120, json={
        "messages": MSG, "max_tokens": 300, "temperature": 0, "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    if r.json()["choices"][0]["finish_reason"] == "stop":  # an unbounded object may run to max_tokens
        assert isinstance(json.loads(content), dict)
    else:
        assert content.startswith("{")
    r = httpx.post(tiny_service.base_url + "/v1/completions", headers=auth("alice"), timeout=120, json={
        "prompt": "Call", "max_tokens": 30, "temperature": 1.0, "seed": 3,
        "response_format": {"type": "regex", "value": r"\+1-[0-9]{3}-[0-9]{4}"}})
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"\+1-[0-9]{3}-[0-9]{4}", r.json()["choices"][0]["text"]), r.json()


def test_tgi_grammar_json_and_regex_generate_and_stream(tiny_service) -> None:  # type: ignore[no-untyped-def]
    url = tiny_service.base_url
    body = {"inputs": "Describe a person.", "parameters": {
        "max_new_tokens": 400, "do_sample": True, "seed": 11, "details": True,
        "grammar": {"type": "json", "value": SCHEMA}}}
    r = httpx.post(url + "/generate", json=body, headers=auth("alice"), timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["details"]["finish_reason"] == "eos_token"
    jsonschema.validate(json.loads(r.json()["generated_text"]), SCHEMA)

    regex = r"(yes|no), [a-z]{2,5}\."
    body = {"inputs": "Answer.", "parameters": {"max_new_tokens": 30, "do_sample": True, "seed": 5,
                                                "grammar": {"type": "regex", "value": regex}}}
    with httpx.stream("POST", url + "/generate_stream", json=body, headers=auth("alice"), timeout=120) as s:
        streamed = [data for _, data in events(s)]
    text = "".join(d["token"]["text"] for d in streamed if not d["token"]["special"])
    assert re.fullmatch(regex, text) and streamed[-1]["generated_text"] == text, streamed[-1]


def test_a_schema_without_additional_properties_gets_only_its_declared_keys(tiny_service) -> None:  # type: ignore[no-untyped-def]
    """OpenAI strict and vLLM never write an undeclared key; JSON Schema alone would allow any, and a
    model then invents keys until max_tokens."""
    schema = {"type": "object", "properties": {"pet": {"enum": ["cat", "dog"]},
                                               "owner": {"type": "object", "properties": {"age": {
                                                   "type": "integer", "minimum": 0, "maximum": 99}}}}}
    for seed in range(6):
        r = httpx.post(tiny_service.base_url + "/v1/chat/completions", headers=auth("alice"), timeout=120,
                       json={"messages": MSG, "max_tokens": 80, "temperature": 1.0, "seed": seed,
                             "response_format": {"type": "json_schema",
                                                 "json_schema": {"name": "p", "schema": schema}}})
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        value = json.loads(choice["message"]["content"])
        assert set(value) <= {"pet", "owner"} and set(value.get("owner", {})) <= {"age"}, value


def test_closing_walks_schema_positions_only() -> None:
    from conveyor.api.requests.grammar import closed, parsed_schema
    from conveyor.settings import Settings

    item = {"type": "object", "properties": {"a": {"type": "integer"}}}
    schema = {"type": "object", "properties": {
        "list": {"type": "array", "items": item},
        "any": {"type": "object"},  # declares nothing: stays any object
        "open": {**item, "additionalProperties": True},
        "either": {"anyOf": [item, {"type": "null"}]},
        "both": {"allOf": [item, {"properties": {"b": {}}}]},
        "fixed": {"const": {"properties": {"x": 1}}}},
        "$defs": {"Item": item}}
    out = closed(schema)
    props = out["properties"]
    assert out["additionalProperties"] is False and out["$defs"]["Item"]["additionalProperties"] is False
    assert props["list"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in props["any"] and props["open"]["additionalProperties"] is True
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert all("additionalProperties" not in s for s in props["both"]["allOf"])  # parts of one object
    assert props["fixed"] == {"const": {"properties": {"x": 1}}}  # a value, not a schema
    assert "additionalProperties" not in item  # the caller's schema is left as it was
    assert parsed_schema(Settings(json_undeclared_keys="allow"), schema, "f") == schema
