"""Errors as values: each carries its HTTP status, TGI's `error_type` and OpenAI's `type`/`code`;
the app renders them once, in TGI's shape or (on /v1 routes) in OpenAI's."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class ApiError(Exception):
    status_code = 500
    error_type = "internal"  # TGI's error_type
    openai_type = "server_error"
    code: str | None = None

    def __init__(self, message: str, headers: dict[str, str] | None = None, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        self.param = param
        if code is not None:
            self.code = code

    def tgi_body(self) -> dict[str, Any]:
        return {"error": self.message, "error_type": self.error_type}

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.openai_type, "param": self.param,
                          "code": self.code}}


class ValidationError(ApiError):
    status_code = 422
    error_type = "validation"
    openai_type = "invalid_request_error"


class MalformedRequest(ApiError):
    status_code = 400
    error_type = "validation"
    openai_type = "invalid_request_error"


class PayloadTooLarge(ApiError):
    status_code = 413
    error_type = "validation"
    openai_type = "invalid_request_error"
    code = "payload_too_large"


class Unauthorized(ApiError):
    status_code = 401
    error_type = "unauthorized"
    openai_type = "invalid_request_error"
    code = "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class Overloaded(ApiError):
    status_code = 429
    error_type = "overloaded"
    openai_type = "overloaded"
    code = "overloaded"

    def __init__(self, retry_after: int = 1) -> None:
        super().__init__("Model is overloaded", headers={"Retry-After": str(retry_after)})


class NotFound(ApiError):
    status_code = 404
    error_type = "not_found"
    openai_type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(ApiError):
    status_code = 405
    error_type = "validation"
    openai_type = "invalid_request_error"
    code = "method_not_allowed"


class NotReady(ApiError):
    status_code = 503
    error_type = "unavailable"
    openai_type = "server_error"
    code = "not_ready"


class GenerationError(ApiError):
    status_code = 500
    error_type = "generation"


def from_status(status: int, message: str) -> ApiError:
    """An error for a status raised by the framework (unknown route, wrong method, body too big)."""
    by_status: dict[int, type[ApiError]] = {400: MalformedRequest, 401: Unauthorized, 404: NotFound,
                                            405: MethodNotAllowed, 413: PayloadTooLarge, 422: ValidationError}
    cls = by_status.get(status)
    if cls is None:
        error = ApiError(message)
        error.status_code = status
        return error
    return cls(message)


def is_openai_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def render(error: ApiError, path: str) -> JSONResponse:
    """The error in the dialect of the route: OpenAI's objects on /v1, TGI's shape elsewhere."""
    body = error.openai_body() if is_openai_path(path) else error.tgi_body()
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)
