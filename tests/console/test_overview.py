"""`GET /v1/console/overview`: the queue, the live workers, and the fleet's jobs of the last minutes
counted from their records; the operator flag follows admin_tenants."""

from __future__ import annotations

import httpx

from tests.conftest import RunningService
from tests.console.conftest import key_of, wait_ended


def overview(service: RunningService, tenant: str) -> dict:
    answer = httpx.get(service.base_url + "/v1/console/overview", timeout=30,
                       headers={"Authorization": f"Bearer {key_of(tenant)}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_overview_counts_what_the_fleet_did(console_service: RunningService) -> None:
    before = overview(console_service, "alice")
    tokens_before = sum(m["tokens"] for m in before["jobs"]["minutes"])
    answer = httpx.post(console_service.base_url + "/v1/jobs", timeout=30,
                        headers={"Authorization": f"Bearer {key_of('bob')}"},
                        json={"inputs": "Hello", "parameters": {"max_new_tokens": 7}})
    job = wait_ended(console_service, answer.json()["id"], "bob")
    assert job["status"] == "succeeded"
    after = overview(console_service, "alice")  # fleet-wide: alice's view counts bob's job
    assert after["jobs"]["by_status"]["succeeded"] == before["jobs"]["by_status"]["succeeded"] + 1
    assert sum(m["tokens"] for m in after["jobs"]["minutes"]) == tokens_before + 7
    assert len(after["jobs"]["minutes"]) == after["jobs"]["window_s"] // 60
    assert after["queue"] == {"queued": 0, "running": 0}
    [worker] = after["workers"]
    assert after["models"] == [{"name": worker["model"], "aliases": [], "workers": 1, "queued": 0,
                                "running": 0}]
    assert worker["model"] and worker["kv_blocks"] > 0 and after["now"] - worker["heartbeat_at"] < 30
    assert after["tenant"] == "alice" and after["admin"] and not after["open"]
    assert isinstance(after["dead_letters"], int)
    bob = overview(console_service, "bob")
    assert bob["tenant"] == "bob" and not bob["admin"] and bob["dead_letters"] is None


def test_with_no_keys_everything_is_open(tmp_path, services_redis, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """No API keys (loopback dev mode): the console needs no key and the operator pages are open too."""
    from tests.conftest import start_service, stop_service

    service = start_service(tmp_path, services_redis.url, {"CONVEYOR_MODEL": str(tiny_model_dir)}, workers=0)
    try:
        view = httpx.get(service.base_url + "/v1/console/overview", timeout=30).json()
        assert view["open"] and view["admin"] and view["tenant"] == "default" and view["workers"] == []
        assert view["dead_letters"] == 0
        listing = httpx.get(service.base_url + "/v1/admin/dead-letters", timeout=30)
        assert listing.status_code == 200 and listing.json()["data"] == []
    finally:
        stop_service(service)
