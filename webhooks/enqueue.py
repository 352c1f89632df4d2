"""Handing a webhook to RQ without making the caller wait.

The engine worker calls `notify` from its publish path (and the api when it ends a queued job): the
RQ enqueue runs on a thread of its own with its own (blocking) Redis connection, so neither the
engine's steps nor the step pipeline ever wait on it. The RQ job's id is the webhook id, one per
(job, event), enqueued `unique`: a second notify of the same event (a retried pipeline, a job
resumed by another worker) is dropped by RQ, and a receiver sees one webhook-id per event.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from schemas.job import JobSpec, WebhookEvent, webhook_id
from schemas.keys import Keys
from schemas.settings import Settings

if TYPE_CHECKING:
    from rq import Queue

log = logging.getLogger(__name__)

DELIVER = "webhooks.delivery.deliver"  # the RQ job function, imported by the webhook process only
ENQUEUE_TRIES = 5


class WebhookQueue:
    def __init__(self, redis_url: str, keys: Keys, settings: Settings) -> None:
        self.redis_url = redis_url
        self.name = keys.webhook_queue
        self.job_timeout = math.ceil(settings.webhook_timeout) + 30
        self.keep_s = settings.result_ttl + int(sum(settings.webhook_retry_delays))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook-enqueue")
        self._queue: Queue | None = None

    def notify(self, spec: JobSpec, event: WebhookEvent) -> None:
        """Enqueue the job's `event` webhook if it asked for it; returns at once."""
        if spec.webhook is None or event not in spec.webhook.events:
            return
        self._executor.submit(self._enqueue, spec.id, spec.tenant, str(spec.webhook.url), event)

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
        delay = 0.2
        for attempt in range(1, ENQUEUE_TRIES + 1):
            try:
                self._queue.enqueue_call(
                    DELIVER, args=(job_id, event, url, tenant), job_id=msg_id, unique=True,
                    timeout=self.job_timeout, result_ttl=self.keep_s, failure_ttl=self.keep_s,
                    description=f"webhook {event} of job {job_id}",
                )
                return
            except DuplicateJobError:
                return  # enqueued before: one delivery per (job, event)
            except (RedisError, OSError) as exc:
                if attempt == ENQUEUE_TRIES:
                    log.error("webhook %s not enqueued, Redis unavailable (%s): it will not be sent",
                              msg_id, exc, extra={"job_id": job_id, "tenant": tenant})
                    return
                time.sleep(delay)
                delay *= 2
