"""Newest-first pages over a sorted set scored by creation time (jobs, files, batches of a tenant):
`limit` ids after the id `after`, and whether more follow."""

from __future__ import annotations

from redis.asyncio import Redis

from conveyor.api.errors import ValidationError


async def newest_first(redis: Redis, index: str, limit: int, after: str | None,
                       unknown_after: str | None = None) -> tuple[list[str], bool]:
    """With `unknown_after` (what the ids are, e.g. "job"), an `after` the index does not hold is a
    422; without, the page starts from the newest."""
    top = "+inf"
    if after is not None:
        score = await redis.zscore(index, after)
        if score is not None:
            top = f"({score!r}"
        elif unknown_after is not None:
            raise ValidationError(f"after: no {unknown_after} {after!r} in this tenant's list", param="after")
    ids: list[str] = await redis.zrevrangebyscore(index, top, "-inf", start=0, num=limit + 1)  # type: ignore[assignment]
    return ids[:limit], len(ids) > limit
