"""A sync or streaming client that goes away cancels its job, and the worker frees its KV blocks.

Each test waits (generously) for the job to end and then checks that it ended by the path under
test: `cancelled`, with fewer tokens than it asked for — a job that finished would say
`succeeded` — and its KV blocks back in the pool."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import httpx

from tests.api.conftest import TERMINAL, auth, blocks_used, until
from tests.api.sse import events

MAX_NEW = 4000  # max_total_tokens is 4096: as long a job as the service takes
LONG = {"inputs": "Count forever", "parameters": {"max_new_tokens": MAX_NEW}}


def job(service, job_id: str) -> dict:  # type: ignore[no-untyped-def]
    r = httpx.get(service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def ended(service, job_id: str) -> dict:  # type: ignore[no-untyped-def]
    return until(lambda: (j := job(service, job_id))["status"] in TERMINAL and j, f"job {job_id} ended")


def assert_cancelled_mid_way(service, job_id: str) -> None:  # type: ignore[no-untyped-def]
    final = ended(service, job_id)
    assert final["status"] == "cancelled", (final["status"], final.get("result"), final.get("timings"))
    assert final["result"]["finish_reason"] == "cancelled"
    assert final["result"]["usage"]["completion_tokens"] < MAX_NEW  # stopped early, not run out
    until(lambda: blocks_used(service) == 0, "the worker freed the job's KV blocks")


def alices_jobs(service) -> set[str]:  # type: ignore[no-untyped-def]
    r = httpx.get(service.base_url + "/v1/jobs?limit=100", headers=auth("alice"), timeout=10)
    return {j["id"] for j in r.json()["data"]}


def test_streaming_client_disconnect_cancels_its_job_and_frees_its_kv(tiny_service) -> None:  # type: ignore[no-untyped-def]
    with httpx.stream("POST", tiny_service.base_url + "/generate_stream", json=LONG, headers=auth("alice"),
                      timeout=60) as r:
        job_id = r.headers["x-job-id"]
        stream = events(r)  # (closing this iterator would close the connection: keep it)
        for _ in range(4):
            assert not next(stream)[1].get("details")
        until(lambda: blocks_used(tiny_service) > 0, "the job holds KV blocks")
        assert job(tiny_service, job_id)["status"] == "running"
    # the connection is closed here, mid-generation
    assert_cancelled_mid_way(tiny_service, job_id)


def test_sync_client_disconnect_cancels_its_job(tiny_service) -> None:  # type: ignore[no-untyped-def]
    before = alices_jobs(tiny_service)
    url = urlsplit(tiny_service.base_url)
    body = json.dumps(LONG).encode()
    headers = {"Host": url.netloc, **auth("alice"), "Content-Type": "application/json",
               "Content-Length": str(len(body))}
    head = "POST /generate HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    # A raw socket, so the client goes away exactly when the job is seen running (a sync answer has
    # no header before the end, so the job is found in alice's list).
    with socket.create_connection((url.hostname, url.port), timeout=30) as client:
        client.sendall(head.encode() + body)
        [job_id] = until(lambda: alices_jobs(tiny_service) - before, "the sync request's job was listed")
        # Gone as soon as a worker started it (the record says so before its first token; the KV
        # blocks show in a heartbeat only later, by when a fast machine may be far into the job).
        until(lambda: job(tiny_service, job_id)["status"] == "running", "the job is generating")
    assert_cancelled_mid_way(tiny_service, job_id)


def test_openai_streaming_disconnect_cancels(tiny_service) -> None:  # type: ignore[no-untyped-def]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Go"}], "max_tokens": MAX_NEW,
            "stream": True}
    url = tiny_service.base_url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=auth("alice"), timeout=60) as r:
        job_id = r.headers["x-job-id"]
        next(events(r))
    assert_cancelled_mid_way(tiny_service, job_id)
