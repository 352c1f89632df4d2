"""Signatures a receiver can verify with the `standardwebhooks` package, and the secrets settings."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from conveyor.settings import Settings
from conveyor.webhooks.signing import Secrets, sign

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
OTHER = "whsec_" + base64.b64encode(b"o" * 32).decode()


def test_signature_verifies_and_tampering_does_not() -> None:
    body = json.dumps({"type": "job.completed", "data": {"id": "j1"}})
    headers = sign(SECRET, "msg_j1_completed", int(time.time()), body)
    assert headers["webhook-signature"].startswith("v1,")
    assert Webhook(SECRET).verify(body, headers) == {"type": "job.completed", "data": {"id": "j1"}}
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body.replace("j1", "j2"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER).verify(body, headers)
    stale = sign(SECRET, "msg_j1_completed", int(time.time()) - 600, body)
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(SECRET).verify(body, stale)


def test_secrets_per_tenant_file_and_default(tmp_path: Path) -> None:
    path = tmp_path / "secrets.json"
    path.write_text(json.dumps({"bob": OTHER}))
    secrets = Secrets.from_settings(Settings(webhook_secrets=f"alice={SECRET}", webhook_secrets_file=path))
    assert secrets.for_tenant("alice") == SECRET and secrets.for_tenant("bob") == OTHER
    assert secrets.for_tenant("carol") is None
    assert Secrets.from_settings(Settings(webhook_secret=SECRET)).for_tenant("carol") == SECRET


@pytest.mark.parametrize(("settings", "message"), [
    ({"webhook_secrets": "alice"}, "entry 0 is not TENANT=whsec_"),
    ({"webhook_secrets": "alice=whsec_%%%"}, "tenant alice: not a webhook secret"),
    ({"webhook_secret": base64.b64encode(b"k" * 32).decode()}, "starts with whsec_"),
])
def test_bad_secrets_say_how_to_make_one(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        Secrets.from_settings(Settings(**settings))
    assert "TENANT=" in message or "os.urandom" in str(error.value)


def test_retry_schedule_setting() -> None:
    assert Settings().webhook_retry_delays == [10, 40, 160, 640, 2560]
    assert Settings(webhook_retry_schedule="1, 2").webhook_retry_delays == [1, 2]
    with pytest.raises(ValueError, match="webhook_retry_schedule"):
        Settings(webhook_retry_schedule="1,soon")
