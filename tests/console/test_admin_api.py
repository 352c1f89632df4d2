"""The dead-letter admin endpoints over HTTP, against a real api and worker: list, requeue (the job
runs again from the start and succeeds), delete; operators only."""

from __future__ import annotations

import httpx

from tests.api.conftest import keys_of, redis_of
from tests.conftest import RunningService
from tests.console.conftest import dead_letter, job_view, key_of, wait_ended


def call(service: RunningService, method: str, path: str, tenant: str = "alice") -> httpx.Response:
    return httpx.request(method, service.base_url + path, timeout=30,
                         headers={"Authorization": f"Bearer {key_of(tenant)}"})


def test_list_shows_the_entry_with_its_reason(console_service: RunningService) -> None:
    entry_id, job_id = dead_letter(console_service, reason="poisoned: test reason 1")
    listing = call(console_service, "GET", "/v1/admin/dead-letters").json()
    [entry] = [e for e in listing["data"] if e["id"] == entry_id]
    assert entry["job_id"] == job_id and entry["tenant"] == "alice"
    assert entry["reason"] == "poisoned: test reason 1"
    assert entry["deliveries"] == 4 and entry["worker"] == "worker-gone" and entry["job_status"] == "failed"
    assert entry["requeueable"] and listing["total"] >= 1
    assert listing["data"][0]["id"] >= listing["data"][-1]["id"]  # newest first


def test_requeue_runs_the_job_afresh_and_it_succeeds(console_service: RunningService) -> None:
    entry_id, job_id = dead_letter(console_service)
    assert job_view(console_service, job_id)["status"] == "failed"
    answer = call(console_service, "POST", f"/v1/admin/dead-letters/{entry_id}/requeue")
    assert answer.status_code == 202, answer.text
    assert answer.json()["id"] == job_id and answer.json()["status"] == "queued"
    job = wait_ended(console_service, job_id)
    assert job["status"] == "succeeded", job
    assert job["result"]["usage"]["completion_tokens"] == 6 and job["result"]["error"] is None
    with redis_of(console_service) as redis:
        keys = keys_of(console_service)
        assert not [e for e in redis.xrange(keys.dead_letter_stream) if e[0] == entry_id]
        assert redis.hget(keys.job(job_id), "attempts") == "1"  # a new attempt budget
    events = call(console_service, "GET", f"/v1/jobs/{job_id}/events").text
    assert "id: 0\n" in events and "id: 5\n" in events  # the tokens of this run, from index 0
    assert call(console_service, "GET", "/v1/jobs?limit=1").json()["data"][0]["id"] == job_id
    again = call(console_service, "POST", f"/v1/admin/dead-letters/{entry_id}/requeue")
    assert again.status_code == 404 and "requeued already" in again.json()["error"]["message"]


def test_requeue_refuses_a_job_that_is_queued_or_running(console_service: RunningService) -> None:
    entry_id, job_id = dead_letter(console_service)
    with redis_of(console_service) as redis:
        redis.hset(keys_of(console_service).job(job_id), "status", "running")
    answer = call(console_service, "POST", f"/v1/admin/dead-letters/{entry_id}/requeue")
    assert answer.status_code == 409 and "running already" in answer.json()["error"]["message"]
    call(console_service, "DELETE", f"/v1/admin/dead-letters/{entry_id}")


def test_delete_removes_the_entry(console_service: RunningService) -> None:
    entry_id, job_id = dead_letter(console_service)
    answer = call(console_service, "DELETE", f"/v1/admin/dead-letters/{entry_id}")
    assert answer.status_code == 200
    assert answer.json() == {"id": entry_id, "object": "dead_letter", "deleted": True}
    listing = call(console_service, "GET", "/v1/admin/dead-letters?limit=100").json()
    assert entry_id not in [e["id"] for e in listing["data"]]
    assert call(console_service, "DELETE", f"/v1/admin/dead-letters/{entry_id}").status_code == 404
    assert job_view(console_service, job_id)["status"] == "failed"  # the record is left alone


def test_a_tenant_outside_admin_tenants_gets_403(console_service: RunningService) -> None:
    entry_id, _ = dead_letter(console_service)
    for method, path in (("GET", "/v1/admin/dead-letters"), ("DELETE", f"/v1/admin/dead-letters/{entry_id}"),
                         ("POST", f"/v1/admin/dead-letters/{entry_id}/requeue")):
        answer = call(console_service, method, path, tenant="bob")
        assert answer.status_code == 403, (method, path, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "forbidden" and "'bob' is not an operator" in error["message"]
        assert "admin_tenants" in error["message"]
    assert httpx.get(console_service.base_url + "/v1/admin/dead-letters", timeout=10).status_code == 401
    assert call(console_service, "GET", "/v1/admin/dead-letters").status_code == 200  # still there for alice


def test_bad_entry_ids_and_the_openapi_document(console_service: RunningService) -> None:
    answer = call(console_service, "DELETE", "/v1/admin/dead-letters/not-an-id")
    assert answer.status_code == 422 and answer.json()["error"]["param"] == "entry_id"
    paths = httpx.get(console_service.base_url + "/openapi.json", timeout=10).json()["paths"]
    assert set(paths["/v1/admin/dead-letters"]["get"]["responses"]) >= {"200", "401", "403", "503"}
    requeue = paths["/v1/admin/dead-letters/{entry_id}/requeue"]["post"]["responses"]
    assert set(requeue) >= {"202", "403", "404", "409", "429"}
    assert "403" in paths["/v1/admin/dead-letters/{entry_id}"]["delete"]["responses"]
    assert "/console" not in paths and "/v1/console/overview" in paths
