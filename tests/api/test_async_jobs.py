"""Async jobs against the real api + worker (tiny model): submit, poll, follow, resume, cancel."""

from __future__ import annotations

import time

import httpx

from conveyor.api.jobpath.store import PROVISIONAL_TTL_S
from tests.api.conftest import TERMINAL, auth, blocks_used, keys_of, redis_of, until
from tests.api.sse import events

LONG = {"inputs": "Count forever", "parameters": {"max_new_tokens": 1500}}


def submit(service, body: dict, tenant: str = "alice", **headers: str) -> httpx.Response:  # type: ignore[no-untyped-def]
    r = httpx.post(service.base_url + "/v1/jobs", json=body, headers={**auth(tenant), **headers}, timeout=30)
    assert r.status_code == 202, r.text
    return r


def get(service, path: str, tenant: str = "alice") -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.get(service.base_url + path, headers=auth(tenant), timeout=30)


def wait_status(service, job_id: str, statuses: set[str], timeout: float = 60) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        job = get(service, f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return job
        assert time.monotonic() < deadline, f"job still {job['status']} after {timeout}s"
        time.sleep(0.05)


def read_events(service, job_id: str, last_event_id: int | None = None,  # type: ignore[no-untyped-def]
                stop_after: int | None = None) -> list[tuple[int | None, dict]]:
    headers = {**auth("alice")}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    out = []
    url = service.base_url + f"/v1/jobs/{job_id}/events"
    with httpx.stream("GET", url, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for item in events(r):
            out.append(item)
            if stop_after is not None and len(out) == stop_after:
                break  # the client drops the connection
    return out


def test_submit_poll_and_events_agree(tiny_service) -> None:  # type: ignore[no-untyped-def]
    r = submit(tiny_service, {"inputs": "Hello", "parameters": {"max_new_tokens": 12}})
    accepted = r.json()
    job_id = accepted["id"]
    assert accepted["status"] == "queued"
    assert accepted["urls"] == {"self": f"/v1/jobs/{job_id}", "events": f"/v1/jobs/{job_id}/events",
                                "cancel": f"/v1/jobs/{job_id}"}
    assert r.headers["location"] == accepted["urls"]["self"]
    ttl = redis_of(tiny_service).ttl(keys_of(tiny_service).job(job_id))
    assert ttl == -1 or ttl > PROVISIONAL_TTL_S  # queued or running: kept; ended: the result's TTL
    job = wait_status(tiny_service, job_id, {"succeeded"})
    assert job["kind"] == "generate" and job["finished_at"] >= job["started_at"] >= job["created_at"]
    streamed = read_events(tiny_service, job_id)
    assert [i for i, _ in streamed] == list(range(len(streamed)))
    assert streamed[-1][1]["final"] is True
    text = "".join(e["token"]["text"] for _, e in streamed if not e["token"]["special"])
    assert text == job["result"]["generated_text"] == streamed[-1][1]["result"]["generated_text"]


def test_chat_body_job(tiny_service) -> None:  # type: ignore[no-untyped-def]
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "priority": 5}
    job_id = submit(tiny_service, body).json()["id"]
    job = wait_status(tiny_service, job_id, {"succeeded"})
    assert job["kind"] == "chat" and job["priority"] == 5
    assert job["result"]["usage"]["completion_tokens"] <= 4


def test_resume_with_last_event_id_while_running_and_after(tiny_service) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(tiny_service, {"inputs": "Hello", "parameters": {"max_new_tokens": 200}}).json()["id"]
    first = read_events(tiny_service, job_id, stop_after=5)
    k = first[-1][0]
    assert [i for i, _ in first] == [0, 1, 2, 3, 4]
    rest = read_events(tiny_service, job_id, last_event_id=k)  # reconnects, most likely mid-generation
    ids = [i for i, _ in rest]
    assert ids == list(range(k + 1, k + 1 + len(ids))) and rest[-1][1]["final"]
    wait_status(tiny_service, job_id, {"succeeded"})
    again = read_events(tiny_service, job_id, last_event_id=k)  # the job has finished
    assert again == rest
    assert read_events(tiny_service, job_id, last_event_id=ids[-1]) == []  # seen the end: nothing more


def test_delete_running_job_cancels_it(tiny_service) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(tiny_service, LONG).json()["id"]
    read_events(tiny_service, job_id, stop_after=2)  # it is generating
    r = httpx.delete(tiny_service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=30)
    assert r.status_code in (200, 202), r.text
    job = wait_status(tiny_service, job_id, TERMINAL)
    # ended by the cancel, not by running out of tokens; its KV blocks are back
    assert job["status"] == "cancelled" and job["cancel_requested"], job
    assert job["result"]["finish_reason"] == "cancelled"
    assert job["result"]["usage"]["completion_tokens"] < LONG["parameters"]["max_new_tokens"]
    until(lambda: blocks_used(tiny_service) == 0, "the worker freed the job's KV blocks")
    again = httpx.delete(tiny_service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=30)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"  # terminal: unchanged
    assert read_events(tiny_service, job_id)[-1][1]["final"]


def test_delete_finished_job_keeps_its_state(tiny_service) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(tiny_service, {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}).json()["id"]
    wait_status(tiny_service, job_id, {"succeeded"})
    r = httpx.delete(tiny_service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "succeeded"


def test_another_tenant_gets_404(tiny_service) -> None:  # type: ignore[no-untyped-def]
    job_id = submit(tiny_service, {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}).json()["id"]
    base = tiny_service.base_url
    for method, path in [("GET", f"/v1/jobs/{job_id}"), ("GET", f"/v1/jobs/{job_id}/events"),
                         ("DELETE", f"/v1/jobs/{job_id}")]:
        r = httpx.request(method, base + path, headers=auth("bob"), timeout=30)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["error"]["code"] == "not_found"
    assert job_id not in [j["id"] for j in get(tiny_service, "/v1/jobs?limit=100", "bob").json()["data"]]
    # bob's DELETE did nothing
    assert wait_status(tiny_service, job_id, {"succeeded"})["status"] == "succeeded"
