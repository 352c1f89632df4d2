"""Webhooks at submission (the api alone, no worker): internal targets are refused with 422 before a
job exists and nothing is ever sent to them; a tenant without a signing secret cannot ask for one.
The service allows `backend.example` by name (no DNS in tests) and has a secret for alice only."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import auth

BODY = {"inputs": "Hello", "parameters": {"max_new_tokens": 5}}


def submit(service, webhook: dict, tenant: str = "alice") -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.post(service.base_url + "/v1/jobs", json={**BODY, "webhook": webhook}, headers=auth(tenant),
                      timeout=30)


def job_ids(service, tenant: str = "alice") -> list[str]:  # type: ignore[no-untyped-def]
    r = httpx.get(service.base_url + "/v1/jobs?limit=100", headers=auth(tenant), timeout=30)
    return [job["id"] for job in r.json()["data"]]


@pytest.mark.parametrize(("url", "why"), [
    ("http://169.254.169.254/", "a cloud metadata address"),
    ("http://169.254.169.254/latest/meta-data/iam", "a cloud metadata address"),
    ("http://10.0.0.1/", "a private address"),
    ("https://10.0.0.1:8443/hooks", "a private address"),
    ("http://127.0.0.1:8080/hook", "a loopback address"),
    ("http://localhost/hook", "a loopback address"),
    ("http://[::ffff:10.0.0.1]/", "a private address"),
    ("http://[fe80::1]/", "a link-local address"),
])
def test_internal_webhook_targets_are_refused(queue_service, url: str, why: str) -> None:  # type: ignore[no-untyped-def]
    before = job_ids(queue_service)
    r = submit(queue_service, {"url": url, "events": ["completed"]})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == "webhook.url" and why in error["message"]
    assert "webhook_allow" in error["message"]  # what an operator can do about it
    assert job_ids(queue_service) == before  # no job, so nothing could ever be delivered


def test_a_tenant_without_a_secret_cannot_ask_for_webhooks(queue_service) -> None:  # type: ignore[no-untyped-def]
    r = submit(queue_service, {"url": "https://backend.example/hooks"}, tenant="bob")
    assert r.status_code == 422 and r.json()["error"]["param"] == "webhook"
    assert "webhook_secrets" in r.json()["error"]["message"]


def test_an_allowed_host_is_accepted(queue_service) -> None:  # type: ignore[no-untyped-def]
    r = submit(queue_service, {"url": "https://backend.example/hooks"})
    assert r.status_code == 202, r.text
    url = queue_service.base_url + r.json()["urls"]["self"]
    job = httpx.get(url, headers=auth("alice"), timeout=30).json()
    assert job["webhook"]["url"] == "https://backend.example/hooks" and job["webhook_deliveries"] == []
    httpx.delete(queue_service.base_url + r.json()["urls"]["cancel"], headers=auth("alice"), timeout=30)
