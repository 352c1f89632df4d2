"""RQ's own keys in Redis that have no TTL, and what bounds each one.

Every key of one webhook expires: the RQ job hash `rq:job:<webhook id>` carries the enqueue's
`ttl` (conveyor/webhooks/enqueue.py: `result_ttl` + the whole retry schedule, past which the job's record is
gone and there is nothing left to send) while it waits in the queue or for its next attempt, none
only while an attempt runs (at most `webhook_timeout` + 30 s, RQ's job timeout), and
`result_ttl`/`failure_ttl` with its results stream `rq:results:<webhook id>` once the delivery
ended. The scheduler lock, the scheduler's and each worker's hash, and the maintenance locks carry
TTLs of RQ's own.

What persists are RQ's shared keys: sets and sorted sets of ids that RQ itself empties, each
bounded by the traffic of a window, not by time since the start (and Redis deletes a set, sorted
set or list once it is empty):

- `rq:queues`: the set of queue keys (one member: this deployment's webhook queue).
- `rq:workers`, `rq:workers:<queue>`: the live webhook processes (one member each); a member whose
  process died without deregistering is dropped by RQ's maintenance (every 10 minutes) once that
  worker's own key has expired.
- `rq:queue:<queue>` and its intermediate list: webhooks waiting for a free webhook process.
- `rq:wip:<queue>` (started): deliveries in progress, at most one per webhook process.
- `rq:scheduled:<queue>`: deliveries waiting for their retry, each for at most the retry delay.
- `rq:finished:<queue>`, `rq:failed:<queue>`: ids of ended deliveries, scored by their expiry;
  RQ's maintenance removes the expired ones, so each holds about the last `result_ttl` (+ 10
  minutes) of webhooks.
- `rq:deferred:<queue>`, `rq:canceled:<queue>`: unused by Conveyor (no dependencies, no cancels).
"""

from __future__ import annotations


def persistent_rq_keys(queue_name: str) -> tuple[str, ...]:
    """The names, as the installed RQ spells them, of its keys without a TTL for `queue_name`."""
    from redis import Redis
    from rq import Queue
    from rq.worker_registration import REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY

    queue = Queue(queue_name, connection=Redis())  # builds names only: never connects
    registries = (queue.started_job_registry, queue.finished_job_registry, queue.failed_job_registry,
                  queue.scheduled_job_registry, queue.deferred_job_registry, queue.canceled_job_registry)
    return (Queue.redis_queues_keys, REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY % queue_name, queue.key,
            queue.intermediate_queue_key, *(registry.key for registry in registries))
