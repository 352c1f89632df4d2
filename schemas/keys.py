"""The Redis layout, in one place (DESIGN.md §3).

Every key shares a prefix. The keys of one job carry the hash tag `{job_id}` so the multi-key
operations of a job stay in one slot and the layout runs on Redis Cluster unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

WORKER_GROUP = "workers"


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "conveyor"

    @property
    def jobs_stream(self) -> str:
        """Stream of submitted jobs; consumer group WORKER_GROUP."""
        return f"{self.prefix}:jobs"

    @property
    def dead_letter_stream(self) -> str:
        return f"{self.prefix}:jobs:dead"

    @property
    def control_channel(self) -> str:
        """Pub/sub channel for cancel requests, read by every worker."""
        return f"{self.prefix}:control"

    def job(self, job_id: str) -> str:
        """Hash: the job record (status, timestamps, request, result)."""
        return f"{self.prefix}:job:{{{job_id}}}"

    def events(self, job_id: str) -> str:
        """Stream of the job's token events (capped), for replay and resume."""
        return f"{self.prefix}:job:{{{job_id}}}:events"

    def channel(self, job_id: str) -> str:
        """Pub/sub channel of the job's live events."""
        return f"{self.prefix}:job:{{{job_id}}}:live"

    def worker(self, worker_id: str) -> str:
        """Heartbeat key of a worker (with a TTL)."""
        return f"{self.prefix}:worker:{worker_id}"

    @property
    def workers_pattern(self) -> str:
        return f"{self.prefix}:worker:*"

    def idempotency(self, tenant: str, key: str) -> str:
        return f"{self.prefix}:idem:{tenant}:{key}"

    def job_keys(self, job_id: str) -> tuple[str, str]:
        """Keys that get the result TTL when a job ends."""
        return (self.job(job_id), self.events(job_id))
