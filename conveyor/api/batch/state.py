"""A batch's state in Redis (one hash per batch), its status moves, and the tenant's listing.

Moves are conditional scripts on the one hash, so an api process that cancels and one that advances
the batch never overwrite each other's status. The counters and the line cursor are fields of the
same hash, changed with HINCRBY / a script, so several api processes never claim the same line.
"""

from __future__ import annotations

import json
import time
import uuid

from redis.asyncio import Redis

from conveyor.api.paging import newest_first
from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.scripts.batches import CLAIM_LINE, MOVE
from conveyor.settings import Settings
from conveyor.wire.batch import COMPLETION_WINDOW_S, Batch, BatchCreate, BatchErrors, RequestCounts

TIMESTAMPS = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
              "cancelling_at", "cancelled_at")


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def _int(record: dict[str, str], field: str) -> int | None:
    value = record.get(field)
    return int(float(value)) if value else None


def view(batch_id: str, record: dict[str, str]) -> Batch:
    """The batch as OpenAI shows it."""
    errors = BatchErrors.model_validate_json(record["errors"]) if record.get("errors") else None
    return Batch(
        id=batch_id, endpoint=record["endpoint"], errors=errors, input_file_id=record["input_file_id"],
        completion_window=record["completion_window"], status=record["status"],  # type: ignore[arg-type]
        output_file_id=record.get("output_file_id"), error_file_id=record.get("error_file_id"),
        created_at=_int(record, "created_at") or 0, expires_at=_int(record, "expires_at"),
        request_counts=RequestCounts(total=_int(record, "total") or 0,
                                     completed=_int(record, "completed") or 0,
                                     failed=_int(record, "failed") or 0),
        metadata=json.loads(record["metadata"]) if record.get("metadata") else None,
        **{field: _int(record, field) for field in TIMESTAMPS},  # type: ignore[arg-type]
    )


class BatchStore:
    def __init__(self, redis: Redis, keys: Keys, settings: Settings) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings
        self._move = redis.register_script(MOVE.source)
        self._claim = redis.register_script(CLAIM_LINE.source)

    async def create(self, tenant: str, body: BatchCreate) -> Batch:
        batch_id = new_batch_id()
        now = time.time()
        window_s = COMPLETION_WINDOW_S[body.completion_window]
        ttl = window_s + self.settings.batch_file_ttl  # outlives its window; shortened when it ends
        record = {
            "tenant": tenant, "endpoint": body.endpoint, "input_file_id": body.input_file_id,
            "completion_window": body.completion_window, "status": "validating", "created_at": now,
            "expires_at": now + window_s, "total": 0, "completed": 0, "failed": 0, "next_line": 0,
            "out_id": f"file-{uuid.uuid4().hex}", "err_id": f"file-{uuid.uuid4().hex}",
        }
        if body.metadata is not None:
            record["metadata"] = json.dumps(body.metadata)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.batch(batch_id), mapping=record)  # type: ignore[arg-type]
        pipe.expire(self.keys.batch(batch_id), ttl)
        pipe.zadd(self.keys.tenant_batches(tenant), {batch_id: now})
        pipe.zremrangebyscore(self.keys.tenant_batches(tenant), "-inf", now - ttl)
        pipe.expire(self.keys.tenant_batches(tenant), ttl)
        pipe.sadd(self.keys.batches_active, batch_id)
        await pipe.execute()
        return view(batch_id, {k: str(v) for k, v in record.items()})

    async def record(self, batch_id: str) -> dict[str, str]:
        return await self.redis.hgetall(self.keys.batch(batch_id))  # type: ignore[return-value]

    async def get(self, tenant: str, batch_id: str) -> Batch | None:
        """The batch; None if it does not exist or is another tenant's."""
        record = await self.record(batch_id)
        if not record or record.get("tenant") != tenant:
            return None
        return view(batch_id, record)

    async def move(self, batch_id: str, status: str, *from_statuses: str) -> bool:
        return bool(await self._move(keys=[self.keys.batch(batch_id)],
                                     args=[status, time.time(), *from_statuses]))

    async def claim(self, batch_id: str) -> int:
        """The next line's index, now in the window; -1: none left; -2: the window is full."""
        return int(await self._claim(keys=[self.keys.batch(batch_id), self.keys.batch_window(batch_id)],
                                     args=[self.settings.batch_window]))

    async def page(self, tenant: str, limit: int, after: str | None) -> tuple[list[Batch], bool]:
        """The tenant's batches, newest first, after the batch `after`; and whether more follow."""
        ids, more = await newest_first(self.redis, self.keys.tenant_batches(tenant), limit, after)
        batches = [await self.get(tenant, i) for i in ids]
        return [b for b in batches if b is not None], more
