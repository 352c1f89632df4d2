"""Body size per route: file uploads (`POST /v1/files`) are bounded by `max_batch_file_bytes`, every
other request by `payload_limit` (conveyor/api/body_limit.py does the counting for both)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.api.body_limit import BodyLimit
from conveyor.api.errors import PayloadTooLarge

UPLOAD_PATH = "/v1/files"
MULTIPART_SLACK = 64 * 1024  # the form's own bytes around the file (boundaries, headers, purpose)


class _UploadBodyLimit(BodyLimit):
    def _error(self, size: str) -> PayloadTooLarge:
        return PayloadTooLarge(f"the upload ({size}) is larger than max_batch_file_bytes "
                               f"({self.limit - MULTIPART_SLACK} bytes): split the batch into smaller files")


class UploadLimit:
    """ASGI middleware: BodyLimit with `upload_limit` on POST /v1/files, `limit` elsewhere."""

    def __init__(self, app: ASGIApp, limit: int, upload_limit: int) -> None:
        self.default = BodyLimit(app, limit)
        self.uploads = _UploadBodyLimit(app, upload_limit + MULTIPART_SLACK)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        is_upload = (scope["type"] == "http" and scope.get("method") == "POST"
                     and scope.get("path") == UPLOAD_PATH)
        await (self.uploads if is_upload else self.default)(scope, receive, send)
