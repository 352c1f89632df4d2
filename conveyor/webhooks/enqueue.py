"""Handing a webhook to RQ without making the caller wait.

The engine worker calls `notify` from its publish path (and the api when it ends a queued job): the
RQ enqueue runs on a thread of its own with its own (blocking) Redis connection, so neither the
engine's steps nor the step pipeline ever wait on it. The RQ job's id is the webhook id, one per
(job, event), enqueued `unique`: a second notify of the same event (a retried pipeline, a job
resumed by another worker) is dropped by RQ, and a receiver sees one webhook-id per event.

A webhook that cannot be enqueued is never dropped silently: every way it can fail (Redis down
after the retries, an RQ or serialization error, a notify after `close`) is logged at ERROR with
the job's id. Every RQ key of a webhook expires (see `rq_keys.py`): `ttl` bounds a webhook that no
webhook process ever starts, `result_ttl`/`failure_ttl` one that ended.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from conveyor.jobqueue.keys import Keys
from conveyor.settings import Settings
from conveyor.wire.job import JobSpec, WebhookEvent, webhook_id

if TYPE_CHECKING:
    from rq import Queue

log = logging.getLogger(__name__)

DELIVER = "conveyor.webhooks.delivery.deliver"  # the RQ job function, imported by the webhook process only
ENQUEUE_TRIES = 5
FIRST_RETRY_S = 0.2  # then doubled: 0.2 + 0.4 + 0.8 + 1.6 s between the tries


def webhook_queue(settings: Settings, keys: Keys) -> WebhookQueue | None:
    """The process's webhook queue on RQ's Redis (conveyor.jobqueue.client.rq_url); None: webhooks are off
    (a Redis Cluster without `webhook_redis_url`: RQ does not run on a cluster)."""
    from conveyor.jobqueue.client import rq_url

    url = rq_url(settings)
    if url is None:
        if settings.redis_url:
            log.warning("webhooks are off: RQ does not run on Redis Cluster; set CONVEYOR_WEBHOOK_REDIS_URL "
                        "to a plain Redis for the webhook queue")
        return None
    return WebhookQueue(url, keys, settings)


class WebhookQueue:
    def __init__(self, redis_url: str, keys: Keys, settings: Settings) -> None:
        self.redis_url = redis_url
        self.name = keys.webhook_queue
        self.job_timeout = math.ceil(settings.webhook_timeout) + 30
        # Past this the job's record has expired, so there is nothing left to send.
        self.keep_s = settings.result_ttl + int(sum(settings.webhook_retry_delays))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook-enqueue")
        self._queue: Queue | None = None

    def notify(self, spec: JobSpec, event: WebhookEvent) -> None:
        """Enqueue the job's `event` webhook if it asked for it; returns at once."""
        if spec.webhook is None or event not in spec.webhook.events:
            return
        msg_id = webhook_id(spec.id, event)
        try:
            future = self._executor.submit(self._enqueue, spec.id, spec.tenant, str(spec.webhook.url), event)
        except RuntimeError as exc:  # the executor was shut down: this process is stopping
            _not_enqueued(msg_id, spec.id, spec.tenant, f"the webhook queue is closed ({exc})")
            return
        future.add_done_callback(lambda done: _check(done, msg_id, spec.id, spec.tenant))

    def close(self) -> None:
        """Waits for the enqueues already handed over (a worker's shutdown)."""
        self._executor.shutdown(wait=True)

    def _enqueue(self, job_id: str, tenant: str, url: str, event: WebhookEvent) -> None:
        from redis import Redis
        from redis.exceptions import RedisError
        from rq import Queue
        from rq.exceptions import DuplicateJobError

        if self._queue is None:
            self._queue = Queue(self.name, connection=Redis.from_url(self.redis_url))
        msg_id = webhook_id(job_id, event)
        delay = FIRST_RETRY_S
        for attempt in range(1, ENQUEUE_TRIES + 1):
            try:
                self._queue.enqueue_call(
                    DELIVER, args=(job_id, event, url, tenant), job_id=msg_id, unique=True,
                    timeout=self.job_timeout, ttl=self.keep_s, result_ttl=self.keep_s,
                    failure_ttl=self.keep_s, description=f"webhook {event} of job {job_id}",
                )
                return
            except DuplicateJobError:
                return  # enqueued before: one delivery per (job, event)
            except (RedisError, OSError) as exc:
                if attempt == ENQUEUE_TRIES:
                    _not_enqueued(msg_id, job_id, tenant, f"Redis unavailable after {attempt} tries ({exc})")
                    return
                time.sleep(delay)
                delay *= 2


def _not_enqueued(msg_id: str, job_id: str, tenant: str, why: str, exc: BaseException | None = None) -> None:
    log.error("webhook %s of job %s not enqueued, it will not be sent: %s", msg_id, job_id, why,
              exc_info=exc, extra={"job_id": job_id, "tenant": tenant, "webhook_id": msg_id})


def _check(done: Future[None], msg_id: str, job_id: str, tenant: str) -> None:
    """Whatever `_enqueue` raised (an RQ that refuses the call, a bad URL, ...) is logged here:
    an exception left in a Future nobody reads would vanish."""
    if done.cancelled():
        _not_enqueued(msg_id, job_id, tenant, "the enqueue was cancelled")
        return
    exc = done.exception()
    if exc is not None:
        _not_enqueued(msg_id, job_id, tenant, f"{type(exc).__name__}: {exc}", exc)
