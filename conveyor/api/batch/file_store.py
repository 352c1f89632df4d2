"""Where files live (batch inputs, outputs, errors): Redis, behind this one small interface.

A file is a metadata hash and a list of its lines (JSONL), so a batch reads its input a few lines at
a time and appends its output as lines finish. Every key lives `batch_file_ttl` seconds. Redis
bounds how large a batch can be: a real object store behind the same methods is the next step for
very large batches.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from redis.asyncio import Redis

from conveyor.api.paging import newest_first
from conveyor.jobqueue.keys import Keys
from conveyor.wire.batch import FileObject, LineError

CHUNK = 1000  # lines per Redis command when writing or reading a whole file


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


class FileStore:
    def __init__(self, redis: Redis, keys: Keys, ttl: int) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl = ttl

    async def create(self, tenant: str, filename: str, purpose: str, lines: list[str], size: int,
                     invalid: dict[int, LineError] | None = None, file_id: str | None = None) -> FileObject:
        """Stores a whole file (its lines, the errors found in them at upload) and lists it."""
        file_id = file_id or new_file_id()
        for start in range(0, len(lines), CHUNK):
            pipe = self.redis.pipeline(transaction=False)
            pipe.rpush(self.keys.file_lines(file_id), *lines[start:start + CHUNK])
            pipe.expire(self.keys.file_lines(file_id), self.ttl)
            await pipe.execute()
        if invalid:
            await self.redis.hset(self.keys.file_invalid(file_id), mapping={
                str(i): e.model_dump_json(exclude_none=True) for i, e in invalid.items()})
            await self.redis.expire(self.keys.file_invalid(file_id), self.ttl)
        return await self.seal(tenant, file_id, filename, purpose, size)

    async def append(self, file_id: str, lines: list[str]) -> None:
        """Adds lines to a file being written (a batch's output); it is listed once sealed."""
        if not lines:
            return
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(self.keys.file_lines(file_id), *lines)
        pipe.expire(self.keys.file_lines(file_id), self.ttl)
        await pipe.execute()

    async def seal(self, tenant: str, file_id: str, filename: str, purpose: str,
                   size: int | None = None) -> FileObject:
        """Writes the file's metadata: from now on it is listed and readable by its tenant."""
        if size is None:
            size = sum([len(line.encode()) + 1 async for line in self._all(file_id)])
        now = int(time.time())
        meta = FileObject(id=file_id, bytes=size, created_at=now, filename=filename, purpose=purpose,
                          expires_at=now + self.ttl)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.file(file_id), mapping={"tenant": tenant, "meta": meta.model_dump_json()})
        pipe.expire(self.keys.file(file_id), self.ttl)
        pipe.zadd(self.keys.tenant_files(tenant), {file_id: time.time()})
        pipe.zremrangebyscore(self.keys.tenant_files(tenant), "-inf", time.time() - self.ttl)
        pipe.expire(self.keys.tenant_files(tenant), self.ttl)
        await pipe.execute()
        return meta

    async def meta(self, tenant: str, file_id: str) -> FileObject | None:
        """The file's metadata; None if it does not exist or is another tenant's."""
        record = await self.redis.hgetall(self.keys.file(file_id))
        if not record or record.get("tenant") != tenant:
            return None
        return FileObject.model_validate_json(record["meta"])

    async def count(self, file_id: str) -> int:
        return int(await self.redis.llen(self.keys.file_lines(file_id)))

    async def lines(self, file_id: str, start: int, stop: int) -> list[str]:
        """Lines start..stop-1 (fewer past the end)."""
        return await self.redis.lrange(self.keys.file_lines(file_id), start, stop - 1)  # type: ignore[return-value]

    async def invalid(self, file_id: str, index: int) -> LineError | None:
        """The error found in line `index` at upload, if any."""
        raw = await self.redis.hget(self.keys.file_invalid(file_id), str(index))
        return LineError.model_validate_json(raw) if raw else None

    async def _all(self, file_id: str) -> AsyncIterator[str]:
        start = 0
        while True:
            chunk = await self.lines(file_id, start, start + CHUNK)
            for line in chunk:
                yield line
            if len(chunk) < CHUNK:
                return
            start += CHUNK

    async def content(self, file_id: str) -> AsyncIterator[bytes]:
        """The file as JSONL bytes, a chunk of lines at a time."""
        async for line in self._all(file_id):
            yield line.encode() + b"\n"

    async def delete(self, tenant: str, file_id: str) -> bool:
        if await self.meta(tenant, file_id) is None:
            return False
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(self.keys.file(file_id), self.keys.file_lines(file_id), self.keys.file_invalid(file_id))
        pipe.zrem(self.keys.tenant_files(tenant), file_id)
        await pipe.execute()
        return True

    async def page(self, tenant: str, limit: int, after: str | None) -> tuple[list[FileObject], bool]:
        """The tenant's files, newest first, after the file `after`; and whether more follow."""
        ids, more = await newest_first(self.redis, self.keys.tenant_files(tenant), limit, after)
        metas = [await self.meta(tenant, i) for i in ids]
        return [m for m in metas if m is not None], more
