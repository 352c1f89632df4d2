"""Hostile input against the live api (one worker, tiny model): property-based fuzzing of the whole
OpenAPI document with schemathesis (valid and invalid requests; no 5xx, and every answer — status,
content type, headers, body — is one the document declares), then targeted cases: 1 MB prompts,
10,000 stop sequences, NaN and Infinity, JSON nested 10,000 deep, invalid UTF-8 and lone
surrogates, header injection in Idempotency-Key and Last-Event-ID. None answers a 5xx, none
creates a job, and the api keeps serving."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from tests.faults.clients import events_url, follow, headers, submit
from tests.faults.conftest import Cluster

pytestmark = [pytest.mark.faults, pytest.mark.slow]

MAX_INPUT, MAX_TOTAL = 256, 512  # small, so what the fuzzer makes valid generates little
EXAMPLES = 25  # per operation and mode: bounded, derandomized (the same cases on every run)
GENERATION = ("/generate", "/generate_stream", "/", "/v1/chat/completions", "/v1/completions", "/v1/jobs")


@pytest.fixture(scope="module")
def cluster(cluster_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return cluster_factory(1, api_env={"CONVEYOR_MAX_INPUT_TOKENS": str(MAX_INPUT),
                                       "CONVEYOR_MAX_TOTAL_TOKENS": str(MAX_TOTAL),
                                       "CONVEYOR_DEFAULT_MAX_NEW_TOKENS": "16"})


def body_for(route: str, prompt: str = "hi", **extra: object) -> dict:
    """The route's request shape with `prompt` and the extra parameters where that dialect puts them."""
    if route in ("/generate", "/generate_stream", "/") or route == "/v1/jobs":
        return {"inputs": prompt, "parameters": {"max_new_tokens": 2, **extra}}
    if route == "/v1/chat/completions":
        return {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2, **extra}
    return {"prompt": prompt, "max_tokens": 2, **extra}


def post_raw(c: Cluster, route: str, content: bytes) -> httpx.Response:
    return httpx.post(c.url + route, content=content, timeout=120,
                      headers=headers(**{"Content-Type": "application/json"}))


def job_keys(c: Cluster) -> int:
    with c.redis() as r:
        return sum(1 for _ in r.scan_iter(match=f"{c.keys.prefix}:job:*", count=1000))


@pytest.fixture
def no_new_job(cluster: Cluster) -> Iterator[None]:
    """The test's requests are all refused: no job record appears, and the api still serves."""
    before = job_keys(cluster)
    yield
    assert job_keys(cluster) == before, "a refused request created a job"
    serves(cluster)


def serves(c: Cluster) -> None:
    assert all(p.poll() is None for p in [*c.fleet.procs.values(), c.apis[0].processes["api"]]), c.logs()
    r = httpx.post(c.url + "/generate", json=body_for("/generate"), headers=headers(), timeout=60)
    assert r.status_code == 200, r.text


def test_schemathesis_finds_no_5xx_and_no_answer_the_document_does_not_declare(cluster: Cluster) -> None:
    import schemathesis
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    c = cluster
    schema = schemathesis.openapi.from_url(c.url + "/openapi.json")
    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_headers_conformance, response_schema_conformance]
    failures: dict[str, str] = {}
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            def run(case) -> None:  # type: ignore[no-untyped-def]
                nonlocal calls
                calls += 1
                # A valid key always: the fuzzer explores the request, not the key table.
                response = case.call(base_url=c.url, headers=headers(), timeout=120)
                case.validate_response(response, checks=checks)

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid: the operation takes no input
                continue
            except (Exception, BaseExceptionGroup) as exc:  # one operation's failure hides no other's
                failures[f"{operation.label} ({mode.value})"] = str(exc)[:1500]
    print(f"schemathesis: {calls} requests, {len(failures)} operation/mode pairs failed")
    assert calls > 0
    assert not failures, "\n\n".join(f"== {k}\n{v}" for k, v in failures.items())
    serves(c)


@pytest.mark.parametrize("route", GENERATION)
def test_a_1mb_prompt_is_422_and_a_body_over_payload_limit_413(cluster: Cluster, no_new_job,  # type: ignore[no-untyped-def]
                                                               route: str) -> None:
    prompt = "hello " * ((1 << 20) // 6)  # 1 MiB of text: far over max_input_tokens, under payload_limit
    r = httpx.post(cluster.url + route, json=body_for(route, prompt), headers=headers(), timeout=120)
    assert r.status_code == 422 and str(MAX_INPUT) in r.text, r.text[:500]
    r = httpx.post(cluster.url + route, json=body_for(route, prompt * 3), headers=headers(), timeout=120)
    assert r.status_code == 413, r.text[:500]


@pytest.mark.parametrize("route", GENERATION)
def test_10000_stop_sequences_are_422(cluster: Cluster, no_new_job, route: str) -> None:  # type: ignore[no-untyped-def]
    stop = [f"s{i}" for i in range(10_000)]
    r = httpx.post(cluster.url + route, json=body_for(route, stop=stop), headers=headers(), timeout=60)
    assert r.status_code == 422 and "stop" in r.text, r.text[:500]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize("route", GENERATION)
def test_nan_and_infinity_are_refused(cluster: Cluster, no_new_job, route: str,  # type: ignore[no-untyped-def]
                                      number: str) -> None:
    raw = json.dumps(body_for(route, temperature=12345.5)).replace("12345.5", number)
    r = post_raw(cluster, route, raw.encode())
    assert r.status_code in (400, 422), (raw, r.status_code, r.text[:300])


@pytest.mark.parametrize("shape", ["array", "object", "in a field"])
@pytest.mark.parametrize("route", ["/generate", "/v1/chat/completions", "/v1/jobs"])
def test_json_nested_10000_deep_is_refused(cluster: Cluster, no_new_job, route: str,  # type: ignore[no-untyped-def]
                                           shape: str) -> None:
    depth = 10_000
    deep = "[" * depth + "]" * depth
    nested = {"array": deep, "object": '{"a":' * depth + "1" + "}" * depth,
              "in a field": json.dumps(body_for(route))[:-1] + ', "x": ' + deep + "}"}[shape]
    r = post_raw(cluster, route, nested.encode())
    assert r.status_code in (400, 422), (r.status_code, r.text[:300])


BAD_TEXT = {
    "invalid UTF-8": b"\xff\xfe\xc3(",
    "lone high surrogate": b"\\ud800",
    "lone low surrogate": b"\\udc00",
    "reversed pair": b"\\udc00\\ud800",
}


@pytest.mark.parametrize("where", ["prompt", "stop"])
@pytest.mark.parametrize("what", list(BAD_TEXT))
@pytest.mark.parametrize("route", GENERATION)
def test_invalid_utf8_and_lone_surrogates_are_refused(cluster: Cluster, no_new_job, route: str, what: str,  # type: ignore[no-untyped-def]
                                                      where: str) -> None:
    body = body_for(route, "MARK") if where == "prompt" else body_for(route, stop=["MARK"])
    raw = json.dumps(body).encode().replace(b"MARK", b"a" + BAD_TEXT[what] + b"b")
    r = post_raw(cluster, route, raw)
    assert r.status_code in (400, 422), (raw, r.status_code, r.text[:300])


def raw_request(c: Cluster, request: bytes) -> int | None:
    """Sends bytes no HTTP client library would (they refuse CR/LF in a header); the status code,
    or None if the server closed the connection without one."""
    host, port = c.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        reply = b""
        while b"\r\n" not in reply:
            chunk = s.recv(4096)
            if not chunk:
                return None
            reply += chunk
    return int(reply.split(b" ", 2)[1])


@pytest.fixture(scope="module")
def done_job(cluster: Cluster) -> str:
    """A finished job (made before `no_new_job` counts them), whose events a client resumes."""
    job_id = submit(cluster.url, body_for("/v1/jobs")).json()["id"]
    assert follow("GET", events_url(cluster.url, job_id), timeout=60).end == "final"
    return job_id


INJECTED = {
    "bare CR": b"a\rb",
    "bare LF": b"a\nb",
    "NUL": b"a\x00b",
    "64 KiB long": b"k" * 65536,
    "non-ASCII (UTF-8)": "clé-é".encode(),
    "non-ASCII (Latin-1)": "clé".encode("latin-1"),
}


@pytest.mark.parametrize("value", list(INJECTED))
@pytest.mark.parametrize("header", ["Idempotency-Key", "Last-Event-ID"])
def test_header_injection_is_a_4xx(cluster: Cluster, done_job: str, no_new_job, header: str,  # type: ignore[no-untyped-def]
                                   value: str) -> None:
    c = cluster
    auth = headers()["Authorization"].encode()
    if header == "Idempotency-Key":
        body = json.dumps(body_for("/v1/jobs")).encode()
        head = (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n" % len(body))
    else:
        path = events_url("", done_job).encode()
        body, head = b"", b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n"
    request = (head + b"Authorization: " + auth + b"\r\n" + header.encode() + b": " + INJECTED[value]
               + b"\r\nConnection: close\r\n\r\n" + body)
    status = raw_request(c, request)
    assert status is not None and 400 <= status < 500, f"{header}: {value!r} answered {status}"

