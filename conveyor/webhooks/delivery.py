"""One delivery attempt of a webhook, run by the RQ worker of `conveyor webhooks`.

The body is the job as `GET /v1/jobs/{id}` shows it when the first attempt is made, wrapped as
`{"type": "job.started" | "job.completed", "timestamp", "data"}`; it is kept in the RQ job's meta,
so every retry sends the same bytes with the same `webhook-id` (a fresh timestamp and signature).
An attempt: re-check the target (SSRF) and connect to the checked address, POST with
`webhook_timeout`, record the attempt in the job record, then decide. 2xx: delivered; 410: gone,
no more tries; 429, 5xx, timeouts and network errors: retried after the next delay of
`webhook_retry_schedule` (jittered; `Retry-After` if longer) through RQ's own Retry and scheduler;
anything else: failed. The retry is RQ's: the function returns `Retry(max, interval)`.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from redis import Redis

from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.scripts.jobs import HSET_IF_EXISTS
from conveyor.settings import Settings
from conveyor.webhooks.signing import Secrets, sign
from conveyor.webhooks.ssrf import Allow, Refusal, resolve
from conveyor.wire.job import (
    WebhookAttempt,
    WebhookDelivery,
    WebhookEvent,
    WebhookState,
    webhook_field,
    webhook_id,
)
from conveyor.wire.jobs_api import JobView

log = logging.getLogger(__name__)

USER_AGENT = "Conveyor-Webhooks/0.1"


@dataclass(frozen=True, slots=True)
class Sent:
    """What one POST came to: the receiver's status code, or why there was none."""

    status: int | None = None
    error: str | None = None
    retry_after: float | None = None
    refused: bool = False  # never sent: the target or the tenant's secret is not acceptable


@dataclass(frozen=True, slots=True)
class Outcome:
    state: WebhookState  # delivered | retrying | failed | gone | refused
    retry_in: float | None = None  # seconds, when retrying
    body: str | None = None  # what was (or would have been) sent


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError):
        return None


class Deliverer:
    def __init__(self, settings: Settings, redis: Redis,
                 on_attempt: Callable[[str, str, float], Any] | None = None,
                 client: httpx.Client | None = None) -> None:
        self.keys = Keys(settings.key_prefix)
        self.redis = redis
        self.secrets = Secrets.from_settings(settings)
        self.allow = Allow.parse(settings.webhook_allow)
        self.delays = settings.webhook_retry_delays
        self.on_attempt = on_attempt  # (event, state, seconds): the process's metrics
        self.client = client or httpx.Client(timeout=settings.webhook_timeout, trust_env=False,
                                             follow_redirects=False)
        self._record = redis.register_script(HSET_IF_EXISTS.source)

    @property
    def max_attempts(self) -> int:
        return len(self.delays) + 1

    def attempt(self, job_id: str, event: WebhookEvent, url: str, tenant: str, attempt: int,
                body: str | None = None) -> Outcome:
        now = time.time()
        msg_id = webhook_id(job_id, event)
        if body is None:
            body = self._body(job_id, event, now)
            if body is None:
                log.warning("webhook %s not sent: the job's record expired first", msg_id,
                            extra={"job_id": job_id, "tenant": tenant})
                if self.on_attempt is not None:
                    self.on_attempt(event, "failed", 0.0)
                return Outcome("failed")
        started = time.perf_counter()
        sent = self._send(url, tenant, msg_id, body, now)
        seconds = time.perf_counter() - started
        outcome = self._decide(attempt, sent, body)
        self._note(job_id, event, msg_id, url, outcome,
                   WebhookAttempt(attempt=attempt, at=round(now, 3), status_code=sent.status,
                                  error=sent.error, duration_s=round(seconds, 4)))
        if self.on_attempt is not None:
            self.on_attempt(event, outcome.state, seconds)
        level = logging.INFO if outcome.state == "delivered" else logging.WARNING
        log.log(level, "webhook %s attempt %d: %s (%s)", msg_id, attempt, outcome.state,
                sent.status if sent.status is not None else sent.error,
                extra={"job_id": job_id, "tenant": tenant, "webhook_id": msg_id, "status_code": sent.status})
        return outcome

    def _body(self, job_id: str, event: WebhookEvent, now: float) -> str | None:
        record: dict[str, str] = self.redis.hgetall(self.keys.job(job_id))  # type: ignore[assignment]
        if not record:
            return None
        view = JobView.from_record(job_id, record).model_dump(mode="json", exclude={"webhook_deliveries"})
        envelope = {"type": f"job.{event}", "timestamp": datetime.fromtimestamp(now, UTC).isoformat(),
                    "data": view}
        return json.dumps(envelope, separators=(",", ":"))

    def _send(self, url: str, tenant: str, msg_id: str, body: str, now: float) -> Sent:
        """One POST, to the address just checked (never to one resolved again by the client)."""
        secret = self.secrets.for_tenant(tenant)
        if secret is None:
            return Sent(error=f"no webhook secret for tenant {tenant!r}: set webhook_secrets", refused=True)
        parsed = httpx.URL(url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            target = resolve(parsed.host, port, self.allow)
        except OSError as exc:
            return Sent(error=f"cannot resolve {parsed.host}: {exc}")
        if isinstance(target, Refusal):
            return Sent(error=target.reason, refused=True)
        headers = {"content-type": "application/json", "user-agent": USER_AGENT,
                   "host": parsed.netloc.decode(), **sign(secret, msg_id, int(now), body)}
        extensions = {"sni_hostname": parsed.host} if parsed.scheme == "https" else {}
        try:
            with self.client.stream("POST", parsed.copy_with(host=target.address), content=body.encode(),
                                    headers=headers, extensions=extensions) as response:
                return Sent(response.status_code,
                            retry_after=retry_after(response.headers.get("retry-after"), now))
        except httpx.TimeoutException:
            return Sent(error=f"timed out after {self.client.timeout.read}s")
        except httpx.HTTPError as exc:
            return Sent(error=f"{type(exc).__name__}: {exc}")

    def _decide(self, attempt: int, sent: Sent, body: str) -> Outcome:
        status = sent.status
        if status is not None and 200 <= status < 300:
            return Outcome("delivered", body=body)
        if status == 410:
            return Outcome("gone", body=body)
        if sent.refused:
            return Outcome("refused", body=body)
        retryable = status is None or status == 429 or status >= 500
        if not retryable or attempt > len(self.delays):
            return Outcome("failed", body=body)
        base = self.delays[attempt - 1]
        delay = base * random.uniform(0.5, 1.0)
        if sent.retry_after is not None:
            delay = max(delay, min(sent.retry_after, max(self.delays)))
        return Outcome("retrying", retry_in=delay, body=body)

    def _note(self, job_id: str, event: WebhookEvent, msg_id: str, url: str, outcome: Outcome,
              attempt: WebhookAttempt) -> None:
        key = self.keys.job(job_id)
        field = webhook_field(event)
        raw = self.redis.hget(key, field)
        delivery = (WebhookDelivery.model_validate_json(raw) if raw
                    else WebhookDelivery(id=msg_id, event=event, url=url))
        delivery.attempts.append(attempt)
        delivery.state = outcome.state
        delivery.next_attempt_at = (round(attempt.at + outcome.retry_in, 3)
                                    if outcome.retry_in is not None else None)
        self._record(keys=[key], args=[field.value, delivery.model_dump_json(exclude_none=True)])


_installed: Deliverer | None = None


def install(deliverer: Deliverer) -> None:
    """The deliverer the RQ job function uses in this process (`conveyor webhooks` sets it)."""
    global _installed
    _installed = deliverer


@functools.cache
def _from_environment() -> Deliverer:
    settings = Settings()
    if not settings.redis_url:
        raise RuntimeError("webhook delivery needs REDIS_URL: run it with `conveyor webhooks`")
    from conveyor.jobqueue.client import make_sync_client

    return Deliverer(settings, make_sync_client(settings, decode_responses=True))


def deliver(job_id: str, event: WebhookEvent, url: str, tenant: str) -> Any:
    """The RQ job function: one attempt; returns RQ's `Retry` to be run again later."""
    from rq import Retry, get_current_job

    deliverer = _installed or _from_environment()
    job = get_current_job()
    attempt = (job.number_of_retries or 0) + 1 if job is not None else 1
    body = job.meta.get("body") if job is not None else None
    outcome = deliverer.attempt(job_id, event, url, tenant, attempt, body)
    if job is not None and body is None and outcome.body is not None:
        job.meta["body"] = outcome.body
        job.save_meta()
    if outcome.retry_in is None:
        return outcome.state
    return Retry(max=len(deliverer.delays), interval=max(1, math.ceil(outcome.retry_in)))
