"""SSE keep-alives (docs/operations/configuration.md, `--sse-keepalive-s`: streams stay open while nothing
happens): a stream that has no event for `sse_keepalive_s` seconds (0.3 in `knobs_service`, which has no
worker, so a job's stream stays silent) gets `: keep-alive` comments, in each of the three dialects, and
no data meanwhile."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import auth

TGI = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}
CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2, "stream": True}


def first_lines(response: httpx.Response, keepalives: int) -> list[str]:
    """The stream's non-empty lines until `keepalives` keep-alive comments came."""
    lines: list[str] = []
    for line in response.iter_lines():
        if line:
            lines.append(line)
        if lines.count(": keep-alive") == keepalives:
            return lines
    raise AssertionError(f"the stream ended after {lines}")


def stream(service, method: str, path: str, body: dict | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    # The read timeout is far above the keep-alive interval: a missing keep-alive fails the read.
    with httpx.stream(method, service.base_url + path, json=body, headers=auth("alice"),
                      timeout=httpx.Timeout(30)) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return first_lines(r, keepalives=2)


@pytest.mark.parametrize(("path", "body"), [("/generate_stream", TGI), ("/v1/chat/completions", CHAT)])
def test_a_silent_generation_stream_gets_keepalives(knobs_service, path: str, body: dict) -> None:  # type: ignore[no-untyped-def]
    assert stream(knobs_service, "POST", path, body) == [": keep-alive"] * 2  # (closing it cancels the job)


def test_a_silent_job_event_stream_gets_keepalives(knobs_service) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(knobs_service.base_url + "/v1/jobs", json=TGI, headers=auth("alice"), timeout=30)
    assert r.status_code == 202, r.text
    urls = r.json()["urls"]
    assert stream(knobs_service, "GET", urls["events"]) == [": keep-alive"] * 2
    httpx.delete(knobs_service.base_url + urls["cancel"], headers=auth("alice"), timeout=30)
