"""Advances the batches: expands each into jobs a window at a time, collects the finished lines into
the output and error files, ends the rest on cancel or expiry, and finalizes.

Every api process runs one runner task; a lease per batch (`SET NX PX`) lets one process advance a
batch at a time, and since all state is in Redis a batch goes on after any api process restarts (the
lease lapses, another takes it). Only `batch_window` lines of a batch are queued or running at once:
the jobs stream is FIFO across the fleet, so an interactive request never waits behind more than that
many of a batch's lines, whatever the batch's size. A line's job id follows from (batch, line), and a
line is claimed into the window and collected out of it by single atomic commands, so two processes
never run or report one line twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid

from fastapi import Request

from conveyor.api.batch.file_store import FileStore
from conveyor.api.batch.lines import BATCH_PRIORITY, line_job, parse_line
from conveyor.api.batch.results import error_line, result_line, unrun_line
from conveyor.api.batch.state import BatchStore
from conveyor.api.context import ApiContext
from conveyor.api.errors import REDIS_FAULTS, Overloaded
from conveyor.api.metrics import ApiMetrics
from conveyor.jobqueue.scripts.batches import LEASE, RELEASE
from conveyor.wire.batch import TERMINAL, BatchError, BatchErrors, BatchLine, LineError, OutputLine
from conveyor.wire.job import JobSpec, JobStatus, RecordField

log = logging.getLogger("conveyor.api.routes.batches")

TICK_S = 0.2  # how often a runner looks at its batches (a new or cancelled batch wakes it at once)
LEASE_MS = 10_000  # a runner that stops renewing hands its batches to another api process after this
UNRUN_CHUNK = 500  # lines reported `batch_expired` / `batch_cancelled` per step
# (reserved id field, public field, name) of the files a batch writes
SEALED = (("out_id", "output_file_id", "output"), ("err_id", "error_file_id", "error"))


def line_job_id(batch_id: str, index: int) -> str:
    """The job of line `index`: the same whichever process submits it."""
    return hashlib.sha256(f"{batch_id}:{index}".encode()).hexdigest()[:32]


class BatchRunner:
    def __init__(self, ctx: ApiContext, metrics: ApiMetrics | None = None) -> None:
        self.ctx = ctx
        self.metrics = metrics
        self.redis = ctx.jobs.redis
        self.keys = ctx.jobs.keys
        self.files = FileStore(self.redis, self.keys, ctx.settings.batch_file_ttl)
        self.batches = BatchStore(self.redis, self.keys, ctx.settings)
        self.owner = uuid.uuid4().hex
        self._lease = self.redis.register_script(LEASE.source)
        self._release = self.redis.register_script(RELEASE.source)
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def of(request: Request) -> BatchRunner:
        runner: BatchRunner = request.app.state.batch_runner
        return runner

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stops advancing and hands back this process's leases, so another api process goes on at once.

        The loop is told to stop as well as cancelled: on Python 3.11 a cancel that lands as a redis-py
        command's socket write completes is lost (its `asyncio.wait_for`), and a loop that waited on
        the cancel alone went on ticking and held the api's shutdown until it was killed."""
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(*REDIS_FAULTS):
            active: set[str] = await self.redis.smembers(self.keys.batches_active)  # type: ignore[misc,assignment]
            for batch_id in active:
                await self._release(keys=[self.keys.batch_lease(batch_id)], args=[self.owner])

    def wake(self) -> None:
        self._wake.set()

    def count(self, status: str) -> None:
        if self.metrics is not None:
            self.metrics.batches.labels(status).inc()

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self.tick()
            except REDIS_FAULTS as exc:
                log.warning("batches not advanced (Redis: %s: %s); retrying", type(exc).__name__, exc)
            except Exception:  # a bug must not end the loop: the batches would stop for this process
                log.exception("batches not advanced; retrying")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):  # (wait_for may drop a cancel on Python 3.11)
                    await self._wake.wait()
            self._wake.clear()

    async def tick(self) -> None:
        active: set[str] = await self.redis.smembers(self.keys.batches_active)  # type: ignore[misc,assignment]
        for batch_id in active:
            if not await self._lease(keys=[self.keys.batch_lease(batch_id)], args=[self.owner, LEASE_MS]):
                continue  # another api process advances it
            try:
                await self.advance(batch_id)
            except REDIS_FAULTS:
                raise
            except Exception:  # a bug in one batch must not stop the others
                log.exception("could not advance batch %s", batch_id)

    async def advance(self, batch_id: str) -> None:
        rec = await self.batches.record(batch_id)
        status = rec.get("status")
        if status is None or status in TERMINAL:
            await self.redis.srem(self.keys.batches_active, batch_id)  # type: ignore[misc]
            return
        if status == "validating":
            await self._validate(batch_id, rec)
        elif status == "finalizing":
            await self._finalize(batch_id, rec)
        else:
            stopping = ("cancelled" if status == "cancelling"
                        else "expired" if time.time() >= float(rec["expires_at"]) else None)
            await self._collect(batch_id, rec, stopping)
            if stopping is None:
                await self._refill(batch_id, rec)
            rec = await self.batches.record(batch_id)
            if await self.redis.hlen(self.keys.batch_window(batch_id)):  # type: ignore[misc]
                return
            if stopping is not None and not await self._unrun(batch_id, rec, stopping):
                return
            if int(rec["next_line"]) >= int(rec["total"]) or stopping is not None:
                await self._end(batch_id, stopping or "completed")

    async def _validate(self, batch_id: str, rec: dict[str, str]) -> None:
        meta = await self.files.meta(rec["tenant"], rec["input_file_id"])
        if meta is None:
            errors = BatchErrors(data=[BatchError(code="file_not_found", param="input_file_id", message=(
                f"the input file {rec['input_file_id']!r} is gone (deleted or expired): upload it again"))])
            await self.redis.hset(self.keys.batch(batch_id), "errors", errors.model_dump_json())  # type: ignore[misc]
            if await self.batches.move(batch_id, "failed", "validating"):
                self.count("failed")
            return
        total = await self.files.count(rec["input_file_id"])
        await self.redis.hset(self.keys.batch(batch_id), "total", total)  # type: ignore[misc]
        if await self.batches.move(batch_id, "in_progress", "validating"):
            self.count("in_progress")

    async def _line(self, rec: dict[str, str], index: int) -> BatchLine | LineError:
        raw = await self.files.lines(rec["input_file_id"], index, index + 1)
        if not raw:
            return LineError(code="file_not_found", message="the input file is gone (deleted or expired)")
        return parse_line(raw[0], index + 1)

    async def _submit(self, batch_id: str, rec: dict[str, str], index: int) -> bool:
        """Submits line `index` as its job, or reports it failed; False: the fleet is full, retry later."""
        job_id = line_job_id(batch_id, index)
        job: JobSpec | LineError | BatchLine = await self.files.invalid(rec["input_file_id"], index) or \
            await self._line(rec, index)
        if isinstance(job, BatchLine):  # its url may be either endpoint, whatever the batch's `endpoint`
            job = line_job(self.ctx, job, rec["tenant"])
        if isinstance(job, LineError):
            await self._finish(batch_id, rec, index, error_line(job_id, job), "failed")
            return True
        spec = job.model_copy(update={"id": job_id, "priority": BATCH_PRIORITY,
                                      "deadline": float(rec["expires_at"])})
        try:
            await self.ctx.jobs.submit(spec, followed=False)
        except Overloaded:
            return False
        return True

    async def _refill(self, batch_id: str, rec: dict[str, str]) -> None:
        while (index := await self.batches.claim(batch_id)) >= 0:
            if not await self._submit(batch_id, rec, index):
                return

    async def _collect(self, batch_id: str, rec: dict[str, str], stopping: str | None) -> None:
        """Reports the window's finished lines; on cancel or expiry, ends the lines not yet run."""
        window: dict[str, str] = await self.redis.hgetall(  # type: ignore[misc,assignment]
            self.keys.batch_window(batch_id))
        if not window:
            return
        indices = sorted(int(i) for i in window)
        pipe = self.redis.pipeline(transaction=False)
        for index in indices:
            pipe.hmget(self.keys.job(line_job_id(batch_id, index)),
                       [RecordField.STATUS, RecordField.SPEC, RecordField.RESULT, RecordField.FINAL])
        for index, (status, spec, result, final) in zip(indices, await pipe.execute(), strict=True):
            job_id = line_job_id(batch_id, index)
            if status is None:  # claimed, not yet submitted (the fleet was full) or its record is gone
                if stopping is None:
                    if not await self._submit(batch_id, rec, index):
                        return
                    continue
                line = await self._line(rec, index)
                await self._finish(batch_id, rec, index, unrun_line(job_id, line, stopping), stopping)
            elif not JobStatus(status).is_terminal:
                await self._stop_job(batch_id, job_id, index, window[str(index)], JobStatus(status), stopping)
            else:
                out, outcome = await self._result_line(rec, index, job_id, spec, result, final)
                await self._finish(batch_id, rec, index, out, outcome)

    async def _stop_job(self, batch_id: str, job_id: str, index: int, mark: str, status: JobStatus,
                        stopping: str | None) -> None:
        if stopping == "cancelled" and mark != "cancelled":
            await self.ctx.jobs.cancel(job_id)
            await self.redis.hset(self.keys.batch_window(batch_id), str(index), "cancelled")  # type: ignore[misc]
        elif stopping == "expired" and status is JobStatus.QUEUED:
            await self.ctx.jobs.end_queued(job_id, JobStatus.EXPIRED)  # a running line may finish

    async def _result_line(self, rec: dict[str, str], index: int, job_id: str, spec_raw: str | None,
                           result_raw: str | None, final_raw: str | None) -> tuple[OutputLine, str]:
        line = await self._line(rec, index)
        return await result_line(self.ctx, line, job_id, spec_raw, result_raw, final_raw)

    async def _finish(self, batch_id: str, rec: dict[str, str], index: int, out: OutputLine,
                      outcome: str) -> None:
        """Writes the line's result once: whoever takes it out of the window."""
        if not await self.redis.hdel(self.keys.batch_window(batch_id), str(index)):  # type: ignore[misc]
            return
        await self.files.append(rec["out_id"] if outcome == "completed" else rec["err_id"],
                                [out.model_dump_json()])
        if outcome in ("completed", "failed"):
            await self.redis.hincrby(self.keys.batch(batch_id), outcome, 1)  # type: ignore[misc]
        if self.metrics is not None:
            self.metrics.batch_lines.labels(outcome).inc()

    async def _unrun(self, batch_id: str, rec: dict[str, str], stopping: str) -> bool:
        """Reports the next chunk of lines never claimed as not run; True once none is left."""
        start, total = int(rec["next_line"]), int(rec["total"])
        if start >= total:
            return True
        stop = min(total, start + UNRUN_CHUNK)
        raws = await self.files.lines(rec["input_file_id"], start, stop)
        out = [unrun_line(line_job_id(batch_id, start + i), parse_line(raw, start + i + 1), stopping)
               for i, raw in enumerate(raws)]
        await self.files.append(rec["err_id"], [o.model_dump_json() for o in out])
        await self.redis.hset(self.keys.batch(batch_id), "next_line", stop)  # type: ignore[misc]
        if self.metrics is not None:
            self.metrics.batch_lines.labels(stopping).inc(len(out))
        return stop >= total

    async def _end(self, batch_id: str, final: str) -> None:
        await self.redis.hset(self.keys.batch(batch_id), "final", final)  # type: ignore[misc]
        if await self.batches.move(batch_id, "finalizing", "in_progress", "cancelling"):
            self.count("finalizing")
        await self._finalize(batch_id, await self.batches.record(batch_id))

    async def _finalize(self, batch_id: str, rec: dict[str, str]) -> None:
        """Seals the output and error files (those with lines), then the final status."""
        for id_field, public, kind in SEALED:
            if not rec.get(public) and await self.files.count(rec[id_field]):
                name = f"{batch_id}_{kind}.jsonl"
                await self.files.seal(rec["tenant"], rec[id_field], name, "batch_output")
                await self.redis.hset(self.keys.batch(batch_id), public, rec[id_field])  # type: ignore[misc]
        final = rec.get("final", "completed")
        if await self.batches.move(batch_id, final, "finalizing"):
            self.count(final)
            log.info("batch %s %s", batch_id, final, extra={"tenant": rec["tenant"]})
        pipe = self.redis.pipeline(transaction=False)
        pipe.srem(self.keys.batches_active, batch_id)
        pipe.expire(self.keys.batch(batch_id), self.ctx.settings.batch_file_ttl)
        pipe.delete(self.keys.batch_window(batch_id), self.keys.batch_lease(batch_id))
        await pipe.execute()
