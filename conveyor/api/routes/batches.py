"""OpenAI's Batch API: `/v1/batches` create, retrieve, cancel, list. Tenant-scoped like jobs.

A batch runs as jobs at the lowest priority, a window of lines at a time (conveyor/api/batch/runner.py):
`validating → in_progress → finalizing → completed | failed | expired`, or `cancelling → cancelled`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from conveyor.api.auth import tenant
from conveyor.api.batch.runner import BatchRunner
from conveyor.api.body_text import unicode_body
from conveyor.api.errors import NotFound, ValidationError
from conveyor.api.openapi import error_responses
from conveyor.wire.batch import COMPLETION_WINDOW_S, Batch, BatchCreate, BatchList

router = APIRouter(prefix="/v1/batches", tags=["Batches"], dependencies=[Depends(unicode_body)])

NOTES = {404: "No such batch for this tenant"}
FOUND_ERRORS = error_responses("openai", 401, 404, 503, notes=NOTES)
AFTER = "The last id of the previous page"


@router.post("", response_model=Batch, responses=error_responses(
    "openai", 400, 401, 404, 413, 422, 503,
    notes={404: "No such input file for this tenant", 422: "Invalid parameter: `completion_window` other "
           "than 24h, an endpoint not served in a batch, a file whose purpose is not `batch`"}))
async def create_batch(body: BatchCreate, request: Request, tenant: str = Depends(tenant)) -> Batch:
    """Create a batch from an uploaded input file; it runs at the lowest priority."""
    if body.completion_window not in COMPLETION_WINDOW_S:
        raise ValidationError(f"completion_window: {body.completion_window!r} is not offered; use '24h'",
                              param="completion_window")
    runner = BatchRunner.of(request)
    meta = await runner.files.meta(tenant, body.input_file_id)
    if meta is None:
        raise NotFound(f"no file {body.input_file_id!r}: upload it with POST /v1/files",
                       param="input_file_id")
    if meta.purpose != "batch":
        raise ValidationError(f"input_file_id: the file's purpose is {meta.purpose!r}, not 'batch'",
                              param="input_file_id")
    batch = await runner.batches.create(tenant, body)
    runner.count("validating")
    runner.wake()
    return batch


async def _batch(request: Request, batch_id: str, tenant: str) -> Batch:
    batch = await BatchRunner.of(request).batches.get(tenant, batch_id)
    if batch is None:
        raise NotFound(f"no batch {batch_id!r}", param="batch_id")
    return batch


@router.get("/{batch_id}", response_model=Batch, responses=FOUND_ERRORS)
async def get_batch(batch_id: str, request: Request, tenant: str = Depends(tenant)) -> Batch:
    """The batch's status, request counts and (once it has ended) its output and error files."""
    return await _batch(request, batch_id, tenant)


@router.post("/{batch_id}/cancel", response_model=Batch, responses=FOUND_ERRORS)
async def cancel_batch(batch_id: str, request: Request, tenant: str = Depends(tenant)) -> Batch:
    """Cancel: lines not yet run are not run (reported `batch_cancelled`), running ones are cancelled;
    `cancelling` until they have stopped, then `cancelled`. A batch that has ended answers unchanged."""
    await _batch(request, batch_id, tenant)
    runner = BatchRunner.of(request)
    if await runner.batches.move(batch_id, "cancelling", "validating", "in_progress"):
        runner.count("cancelling")
        runner.wake()
    return await _batch(request, batch_id, tenant)


@router.get("", response_model=BatchList, responses=error_responses("openai", 401, 422, 503))
async def list_batches(
    request: Request, tenant: str = Depends(tenant),
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=200, description=AFTER)] = None,
) -> BatchList:
    """The caller's batches, newest first."""
    data, has_more = await BatchRunner.of(request).batches.page(tenant, limit, after)
    return BatchList(data=data, first_id=data[0].id if data else None,
                     last_id=data[-1].id if data else None, has_more=has_more)
