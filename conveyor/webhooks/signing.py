"""Standard Webhooks signatures and the secrets that make them, one per tenant.

`webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">` with the tenant's secret
(`whsec_` + base64 bytes), computed by the `standardwebhooks` package — the same code a receiver
verifies with. Secrets come from `webhook_secrets` (`TENANT=whsec_...,...`), `webhook_secrets_file`
(`{"TENANT": "whsec_..."}`) and `webhook_secret` (every other tenant).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from standardwebhooks import Webhook

from conveyor.settings import Settings, read_string_map

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
        entries = read_string_map(settings.webhook_secrets, settings.webhook_secrets_file,
                                  "webhook_secrets", "webhook_secrets_file", ("TENANT", "whsec_..."))
        by_tenant = {t: _checked(secret, f"{where}: tenant {t}") for t, secret, where in entries}
        default = _checked(settings.webhook_secret, "webhook_secret") if settings.webhook_secret else None
        return cls(by_tenant, default)

    def for_tenant(self, tenant: str) -> str | None:
        return self.by_tenant.get(tenant, self.default)


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt."""
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, UTC), body)
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature}
