"""Standard Webhooks signatures and the secrets that make them, one per tenant.

`webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">` with the tenant's secret
(`whsec_` + base64 bytes), computed by the `standardwebhooks` package — the same code a receiver
verifies with. Secrets come from `webhook_secrets` (`TENANT=whsec_...,...`), `webhook_secrets_file`
(`{"TENANT": "whsec_..."}`) and `webhook_secret` (every other tenant).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

from standardwebhooks import Webhook

from schemas.settings import Settings

HOW_TO_MAKE_ONE = ("make one with: python -c \"import base64,os; "
                   "print('whsec_' + base64.b64encode(os.urandom(32)).decode())\"")


def _checked(secret: str, where: str) -> str:
    secret = secret.strip()
    try:
        Webhook(secret)
    except Exception as exc:  # binascii.Error, EmptyWebhookSecretError, ...
        raise ValueError(f"{where}: not a webhook secret ({exc}); {HOW_TO_MAKE_ONE}") from None
    if not secret.startswith("whsec_"):
        raise ValueError(f"{where}: a webhook secret starts with whsec_; {HOW_TO_MAKE_ONE}")
    return secret


@dataclass(frozen=True)
class Secrets:
    by_tenant: dict[str, str] = field(default_factory=dict)
    default: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Secrets:
        """The configured secrets; a ValueError names the setting that is wrong."""
        by_tenant: dict[str, str] = {}
        if settings.webhook_secrets:
            for i, item in enumerate(p.strip() for p in settings.webhook_secrets.split(",")):
                if not item:
                    continue
                tenant, sep, secret = item.partition("=")
                if not sep or not tenant.strip():
                    raise ValueError(f"webhook_secrets: entry {i} is not TENANT=whsec_...")
                by_tenant[tenant.strip()] = _checked(secret, f"webhook_secrets: tenant {tenant.strip()}")
        path = settings.webhook_secrets_file
        if path is not None:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise ValueError(f"webhook_secrets_file {path}: {exc}") from exc
            if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in data.items()):
                raise ValueError(f"webhook_secrets_file {path}: must be a JSON object "
                                 '{"TENANT": "whsec_...", ...} of strings')
            for tenant, secret in data.items():
                by_tenant[tenant] = _checked(secret, f"webhook_secrets_file {path}: tenant {tenant}")
        default = _checked(settings.webhook_secret, "webhook_secret") if settings.webhook_secret else None
        return cls(by_tenant, default)

    def for_tenant(self, tenant: str) -> str | None:
        return self.by_tenant.get(tenant, self.default)


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt."""
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, UTC), body)
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature}
