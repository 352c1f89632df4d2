"""Tool calling through the real api + worker (tiny random model): `required` and a named function go
through the grammar, so their arguments are valid for the function's schema whatever the model;
streamed calls reassemble; `auto` and `none` answer content; tools reach the prompt; tool history in
the input is accepted."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.api.conftest import auth

WEATHER = {"type": "object", "properties": {
    "city": {"enum": ["Paris", "Lima", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
ALARM = {"type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
         "required": ["hour"], "additionalProperties": False}
TOOLS = [{"type": "function",
          "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "set_alarm", "parameters": ALARM}}]
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM}
MSG = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def chat(service, **body: object) -> dict:  # type: ignore[no-untyped-def]
    r = httpx.post(service.base_url + "/v1/chat/completions", headers=auth("alice"), timeout=120,
                   json={"messages": MSG, "tools": TOOLS, "max_tokens": 200, **body})
    assert r.status_code == 200, r.text
    return r.json()


def streamed(service, **body: object) -> tuple[list[dict], str, str]:  # type: ignore[no-untyped-def]
    """The streamed tool calls reassembled by index (as the openai SDK does), the finish reason and
    the content."""
    calls: dict[int, dict] = {}
    reason, content = None, ""
    with httpx.stream("POST", service.base_url + "/v1/chat/completions", headers=auth("alice"), timeout=120,
                      json={"messages": MSG, "tools": TOOLS, "max_tokens": 200, "stream": True, **body}) as r:
        lines = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
        assert lines[-1] == "[DONE]"
        for data in map(json.loads, lines[:-1]):
            choice = data["choices"][0]
            reason = choice["finish_reason"] or reason
            content += choice["delta"].get("content") or ""
            for delta in choice["delta"].get("tool_calls") or []:
                if delta["index"] not in calls:  # the first delta of a call names it
                    assert delta["id"].startswith("call_") and delta["type"] == "function", delta
                    calls[delta["index"]] = {"name": delta["function"]["name"], "arguments": ""}
                calls[delta["index"]]["arguments"] += delta["function"].get("arguments", "")
    return [calls[i] for i in sorted(calls)], reason, content  # type: ignore[return-value]


def streamed_calls(service, **body: object) -> tuple[list[dict], str]:  # type: ignore[no-untyped-def]
    calls, reason, content = streamed(service, **body)
    assert content == ""
    return calls, reason


def check_call(name: str, arguments: str) -> None:
    assert name in SCHEMAS
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_named_function_arguments_follow_its_schema(tiny_service, seed: int) -> None:  # type: ignore[no-untyped-def]
    choice = chat(tiny_service, tool_choice=NAMED, temperature=1.0, seed=seed)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    check_call("get_weather", call["function"]["arguments"])

    calls, reason = streamed_calls(tiny_service, tool_choice=NAMED, temperature=1.0, seed=seed)
    assert reason == "tool_calls" and [c["name"] for c in calls] == ["get_weather"]
    assert calls[0]["arguments"] == call["function"]["arguments"]  # same seed, same tokens
    check_call("get_weather", calls[0]["arguments"])


def test_required_calls_one_of_the_tools_with_valid_arguments(tiny_service) -> None:  # type: ignore[no-untyped-def]
    names = set()
    for seed in range(4):
        choice = chat(tiny_service, tool_choice="required", parallel_tool_calls=False, temperature=1.0,
                      seed=seed)["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        check_call(call["function"]["name"], call["function"]["arguments"])
        names.add(call["function"]["name"])
        calls, reason = streamed_calls(tiny_service, tool_choice="required", parallel_tool_calls=False,
                                       temperature=1.0, seed=seed)
        assert reason == "tool_calls" and calls == [{"name": call["function"]["name"],
                                                     "arguments": call["function"]["arguments"]}]
    assert names  # which tool is the model's choice


def test_auto_and_none_answer_content_and_tools_reach_the_prompt(tiny_service) -> None:  # type: ignore[no-untyped-def]
    plain = httpx.post(tiny_service.base_url + "/v1/chat/completions", headers=auth("alice"), timeout=120,
                       json={"messages": MSG, "max_tokens": 5, "temperature": 0}).json()
    for tool_choice in ("auto", "none"):
        answer = chat(tiny_service, tool_choice=tool_choice, max_tokens=5, temperature=0)
        choice = answer["choices"][0]
        assert choice["finish_reason"] in ("stop", "length") and not choice["message"]["tool_calls"]
        assert choice["message"]["content"]
        # The tools are described in the prompt (SmolLM2's template knows no tools: a system message).
        assert answer["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 50


def test_tool_history_in_the_input_is_accepted(tiny_service) -> None:  # type: ignore[no-untyped-def]
    history = [*MSG,
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": '{"forecast": "sun"}'}]
    choice = chat(tiny_service, messages=history, tool_choice=NAMED, seed=4, temperature=1.0)["choices"][0]
    check_call("get_weather", choice["message"]["tool_calls"][0]["function"]["arguments"])


def test_openai_client_reassembles_a_streamed_call_and_reads_json_schema_output(tiny_service) -> None:  # type: ignore[no-untyped-def]
    import openai

    c = openai.OpenAI(base_url=tiny_service.base_url + "/v1", api_key="key-alice", max_retries=0, timeout=60)
    arguments, names, reason = "", [], None
    for chunk in c.chat.completions.create(model="tiny", messages=MSG, tools=TOOLS, tool_choice="required",  # type: ignore[call-overload]
                                           stream=True, seed=9, max_tokens=200, parallel_tool_calls=False):
        choice = chunk.choices[0]
        reason = choice.finish_reason or reason
        for delta in choice.delta.tool_calls or []:
            names += [delta.function.name] if delta.function and delta.function.name else []
            arguments += delta.function.arguments or "" if delta.function else ""
    assert reason == "tool_calls" and len(names) == 1
    check_call(names[0], arguments)
    whole = c.chat.completions.create(model="tiny", messages=MSG, seed=9, max_tokens=200, response_format={
        "type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER, "strict": True}})
    jsonschema.validate(json.loads(whole.choices[0].message.content or ""), WEATHER)


def test_a_cut_off_call_finishes_length_never_tool_calls(tiny_service) -> None:  # type: ignore[no-untyped-def]
    """As OpenAI and vLLM: max_tokens inside a call is `length`. A named call's arguments stream as
    they come (so the cut-off call is there, unparseable); `required` calls come whole, so a
    cut-off one is dropped, and call JSON is never content."""
    sampled = {"temperature": 1.0, "seed": 5, "max_tokens": 6}
    choice = chat(tiny_service, tool_choice=NAMED, **sampled)["choices"][0]
    assert choice["finish_reason"] == "length"
    (call,) = choice["message"]["tool_calls"]
    with pytest.raises(ValueError):
        json.loads(call["function"]["arguments"])
    calls, reason = streamed_calls(tiny_service, tool_choice=NAMED, **sampled)
    assert reason == "length" and calls[0]["arguments"] == call["function"]["arguments"]
    for parallel in (False, True):
        body = {"tool_choice": "required", "parallel_tool_calls": parallel, **sampled}
        choice = chat(tiny_service, **body)["choices"][0]
        assert choice["finish_reason"] == "length", choice
        assert choice["message"]["content"] is None and choice["message"]["tool_calls"] is None
        assert streamed(tiny_service, **body) == ([], "length", "")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_answers_every_complete_call_whatever_follows(tiny_service, seed: int) -> None:  # type: ignore[no-untyped-def]
    """The grammar may end after any complete call: a model that keeps calling until max_tokens
    still answers the calls it completed (a call here is ~30 tokens), and never content."""
    body = {"tool_choice": "required", "temperature": 1.0, "seed": seed, "max_tokens": 80}
    choice = chat(tiny_service, **body)["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert choice["message"]["content"] is None and calls, choice
    assert choice["finish_reason"] in ("tool_calls", "length")
    for call in calls:
        check_call(call["function"]["name"], call["function"]["arguments"])
    streamed_list, reason, content = streamed(tiny_service, **body)
    assert content == "" and reason == choice["finish_reason"]
    assert streamed_list == [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                             for c in calls]


def test_undeclared_argument_keys_are_never_written(tiny_service) -> None:  # type: ignore[no-untyped-def]
    """A tool whose parameters do not say additionalProperties gets only its declared keys (as
    OpenAI strict and vLLM), not whatever a model invents until max_tokens."""
    open_schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Lima"]}}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": open_schema}}]
    for seed in range(6):
        choice = chat(tiny_service, tools=tools, tool_choice=NAMED, temperature=1.0, seed=seed,
                      max_tokens=60)["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        assert set(json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])) <= {"city"}
