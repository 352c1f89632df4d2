"""OpenAI's Files API for batches: `/v1/files` upload (multipart, `purpose=batch`), metadata, content,
delete, list. Tenant-scoped: another tenant's file answers 404.

An upload is checked line by line at once (conveyor/api/batch/lines.py); a line that fails is reported in the
error file of the batch that runs it, not refused here. Only the file as a whole can be refused:
too large (413, max_batch_file_bytes), too many lines (422, max_batch_requests), not UTF-8 JSONL.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import StreamingResponse

from conveyor.api.auth import tenant
from conveyor.api.batch.lines import check_lines
from conveyor.api.batch.runner import BatchRunner
from conveyor.api.context import ApiContext
from conveyor.api.errors import NotFound, PayloadTooLarge, ValidationError
from conveyor.api.openapi import error_responses
from conveyor.wire.batch import FileDeleted, FileList, FileObject

router = APIRouter(prefix="/v1/files", tags=["Batches"])

NOTES = {404: "No such file for this tenant"}
FOUND_ERRORS = error_responses("openai", 401, 404, 503, notes=NOTES)
AFTER = "The last id of the previous page"
JSONL = {"application/jsonl": {"schema": {"type": "string"}}}
PURPOSES = ("batch",)


def _lines(data: bytes) -> list[str]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"file: not UTF-8 text (byte {exc.start}): upload JSONL, one request per line",
                              param="file") from exc
    return [line for line in (raw.rstrip("\r") for raw in text.split("\n")) if line.strip()]


@router.post("", response_model=FileObject, responses=error_responses(
    "openai", 400, 401, 413, 422, 503, notes={400: "Not a multipart form",
                                              413: "File larger than max_batch_file_bytes",
                                         422: "Not JSONL, more lines than max_batch_requests, or a purpose "
                                              "other than `batch`"}))
async def upload(
    request: Request,
    file: Annotated[UploadFile, File(description="JSONL: one `{custom_id, method, url, body}` per line")],
    purpose: Annotated[str, Form(description="`batch`")],
    tenant: str = Depends(tenant),
) -> FileObject:
    """Upload a batch input file. Each line is checked now; those that fail are reported in the error
    file of the batch that uses the file."""
    ctx = ApiContext.of(request)
    settings = ctx.settings
    if purpose not in PURPOSES:
        raise ValidationError(f"purpose: {purpose!r} is not served here; use 'batch'", param="purpose")
    data = await file.read(settings.max_batch_file_bytes + 1)
    if len(data) > settings.max_batch_file_bytes:
        raise PayloadTooLarge(f"file: larger than max_batch_file_bytes ({settings.max_batch_file_bytes} "
                              "bytes): split the batch into smaller files")
    lines = _lines(data)
    if not lines:
        raise ValidationError("file: no request lines (JSONL, one request per line)", param="file")
    if len(lines) > settings.max_batch_requests:
        raise ValidationError(f"file: {len(lines)} lines, more than max_batch_requests "
                              f"({settings.max_batch_requests}): split the batch", param="file")
    invalid = await asyncio.to_thread(check_lines, ctx, lines, tenant)  # tokenizing: off the event loop
    filename = (file.filename or "batch.jsonl")[:255]
    return await BatchRunner.of(request).files.create(tenant, filename, purpose, lines, len(data), invalid)


async def _meta(request: Request, file_id: str, tenant: str) -> FileObject:
    meta = await BatchRunner.of(request).files.meta(tenant, file_id)
    if meta is None:
        raise NotFound(f"no file {file_id!r}", param="file_id")
    return meta


@router.get("", response_model=FileList, responses=error_responses("openai", 401, 422, 503))
async def list_files(
    request: Request, tenant: str = Depends(tenant),
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=200, description=AFTER)] = None,
    purpose: Annotated[str | None, Query(max_length=64)] = None,
) -> FileList:
    """The caller's files, newest first."""
    data, has_more = await BatchRunner.of(request).files.page(tenant, limit, after)
    if purpose is not None:
        data = [f for f in data if f.purpose == purpose]
    return FileList(data=data, first_id=data[0].id if data else None,
                    last_id=data[-1].id if data else None, has_more=has_more)


@router.get("/{file_id}", response_model=FileObject, responses=FOUND_ERRORS)
async def get_file(file_id: str, request: Request, tenant: str = Depends(tenant)) -> FileObject:
    """A file's metadata."""
    return await _meta(request, file_id, tenant)


@router.get("/{file_id}/content", response_class=StreamingResponse, responses={
    200: {"description": "The file's lines (JSONL)", "content": JSONL}, **FOUND_ERRORS})
async def file_content(file_id: str, request: Request, tenant: str = Depends(tenant)) -> StreamingResponse:
    """A file's content: JSONL, one line per request (input) or per result (a batch's output, error)."""
    await _meta(request, file_id, tenant)
    return StreamingResponse(BatchRunner.of(request).files.content(file_id), media_type="application/jsonl")


@router.delete("/{file_id}", response_model=FileDeleted, responses=FOUND_ERRORS)
async def delete_file(file_id: str, request: Request, tenant: str = Depends(tenant)) -> FileDeleted:
    """Delete a file (a batch that has not read it all yet fails the lines it can no longer read)."""
    if not await BatchRunner.of(request).files.delete(tenant, file_id):
        raise NotFound(f"no file {file_id!r}", param="file_id")
    return FileDeleted(id=file_id, deleted=True)
