"""No key, webhook secret or Authorization value reaches a log line (at any level, in either log
format), a metrics label, /info or the OpenAPI document: a real api process with a key and a
webhook secret, sent keys in the query string (refused with 401, logged by uvicorn's access log)
and in headers, at log level debug."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import httpx
import pytest

from conveyor.telemetry.logs import REDACTED, redact, redact_values
from tests.conftest import RunningService, start_service, stop_service

KEY = "ck-live-0123456789abcdef"  # the configured key
WRONG = "wrong-key-SECRET-4711"  # a key a client sent that is nobody's
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"the webhook signing key, 32 byte").decode()
SECRETS = (KEY, WRONG, WEBHOOK_SECRET, WEBHOOK_SECRET.removeprefix("whsec_"))


@pytest.fixture(scope="module", params=["human", "json"])
def api(request, tmp_path_factory, services_redis, tiny_model_dir) -> Iterator[RunningService]:  # type: ignore[no-untyped-def]
    running = start_service(tmp_path_factory.mktemp(f"secrets-{request.param}"), services_redis.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir), "CONVEYOR_API_KEYS": f"{KEY}=alice",
        "CONVEYOR_WEBHOOK_SECRET": WEBHOOK_SECRET, "CONVEYOR_LOG_LEVEL": "debug",
        "CONVEYOR_LOG_FORMAT": request.param}, workers=0)
    yield running
    stop_service(running)


def api_log(api: RunningService) -> str:
    return (api.log_dir / "api.log").read_text()


def wait_for_log(api: RunningService, text: str, timeout: float = 30) -> str:
    """The api's log once it holds `text` (an access line is written after its answer is sent)."""
    deadline = time.monotonic() + timeout
    while text not in (log := api_log(api)):
        assert time.monotonic() < deadline, f"{text!r} never logged:\n{log[-3000:]}"
        time.sleep(0.05)
    return log


def test_keys_in_the_query_string_and_headers_never_reach_the_log(api: RunningService) -> None:
    base = api.base_url
    refused = httpx.get(f"{base}/v1/models?api_key={WRONG}&limit=1", timeout=30)
    assert refused.status_code == 401  # a key goes in the Authorization header, not the query
    assert httpx.get(f"{base}/v1/jobs?token={KEY}", timeout=30).status_code == 401
    assert httpx.post(f"{base}/generate?access_token={WRONG}", json={"inputs": "x"},
                      headers={"Authorization": f"Bearer {WRONG}"}, timeout=30).status_code == 401
    ok = httpx.get(f"{base}/v1/models?key={KEY}", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert ok.status_code == 200
    log = wait_for_log(api, f"/v1/models?key={REDACTED}")
    assert f"/v1/models?api_key={REDACTED}&limit=1" in log  # what the parameter was, not its value
    assert f"/v1/jobs?token={REDACTED}" in log and f"/generate?access_token={REDACTED}" in log
    for secret in SECRETS:
        assert secret not in log, secret


def test_no_secret_in_metrics_info_or_the_openapi_document(api: RunningService) -> None:
    for path in ("/metrics", "/info", "/openapi.json", "/ready"):
        text = httpx.get(api.base_url + path, timeout=30).text
        for secret in SECRETS:
            assert secret not in text, (path, secret)


@pytest.mark.parametrize(("line", "expected"), [
    ('1.2.3.4:5 - "GET /v1/jobs?after=a&api_key=s3cr3t HTTP/1.1" 401',
     f'1.2.3.4:5 - "GET /v1/jobs?after=a&api_key={REDACTED} HTTP/1.1" 401'),
    ("/x?API%5FKEY=s3cr3t;password=p", f"/x?API%5FKEY={REDACTED};password={REDACTED}"),
    ('{"message": "GET /x?token=s3cr3t\\" 200"}', f'{{"message": "GET /x?token={REDACTED}\\" 200"}}'),
    ("/x?keyword=1&monkey=2", "/x?keyword=1&monkey=2"),  # not secret parameters
    ("Authorization: Bearer abcdefgh12345", f"Authorization: Bearer {REDACTED}"),
    ("Basic dXNlcjpwYXNzd29yZA==", f"Basic {REDACTED}"),
    ("a basic check of the Bearer token", "a basic check of the Bearer token"),
    ("redis://user:pw@host:6379/0 and redis://host:6379", f"redis://user:{REDACTED}@host:6379/0 and "
                                                          "redis://host:6379"),
    ("signing with whsec_abc+/= now", f"signing with whsec_{REDACTED} now"),
])
def test_redact(line: str, expected: str) -> None:
    assert redact(line) == expected


def test_configured_values_are_masked_anywhere() -> None:
    redact_values(["tenant-key-0001", "short"])
    assert redact("the key tenant-key-0001 was used") == f"the key {REDACTED} was used"
    assert redact("a short word") == "a short word"  # too short to mask verbatim without damage
