"""Errors as values: each carries its HTTP status and TGI's `error_type`; the app maps them once."""

from __future__ import annotations


class ApiError(Exception):
    status_code = 500
    error_type = "internal"

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class ValidationError(ApiError):
    status_code = 422
    error_type = "validation"


class MalformedRequest(ApiError):
    status_code = 400
    error_type = "validation"


class Overloaded(ApiError):
    status_code = 429
    error_type = "overloaded"

    def __init__(self, retry_after: int = 1) -> None:
        super().__init__("Model is overloaded", headers={"Retry-After": str(retry_after)})


class NotFound(ApiError):
    status_code = 404
    error_type = "not_found"


class GenerationError(ApiError):
    status_code = 500
    error_type = "generation"
