"""A job's webhook, checked at submission: the tenant has a secret to sign it with, and the URL does
not lead inside our network (SSRF; the delivery checks again at each attempt)."""

from __future__ import annotations

from conveyor.api.errors import ValidationError
from conveyor.webhooks import ssrf
from conveyor.webhooks.signing import Secrets
from conveyor.wire.job import Webhook


async def check_webhook(webhook: Webhook, tenant: str, secrets: Secrets, allow: ssrf.Allow,
                        enabled: bool = True) -> None:
    if not enabled:  # a Redis Cluster without webhook_redis_url (conveyor.jobqueue.client.rq_url)
        raise ValidationError(
            "webhook: webhooks are off on this server (it runs on Redis Cluster, where their queue, RQ, "
            "does not run); ask its operator to set webhook_redis_url, or submit without one",
            param="webhook")
    if secrets.for_tenant(tenant) is None:
        raise ValidationError(
            "webhook: this server has no webhook secret for your tenant, so it could not sign your "
            "webhooks; ask its operator to set webhook_secrets (or webhook_secret), or submit without one",
            param="webhook")
    url = webhook.url
    refusal = await ssrf.check(url.host or "", url.port or (443 if url.scheme == "https" else 80), allow)
    if refusal is not None:
        raise ValidationError(f"webhook.url: {refusal.reason}", param="webhook.url")
