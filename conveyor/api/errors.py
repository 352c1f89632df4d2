"""Errors as values: each carries its HTTP status, TGI's `error_type` and OpenAI's `type`/`code`;
the app renders them once, in TGI's shape or (on /v1 routes) in OpenAI's. `install` maps what the
framework and Redis raise onto them: a client's mistake is a 4xx naming the field, Redis failing
is 503 with Retry-After, and only a bug of ours is a 500."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException

log = logging.getLogger("conveyor.api.errors")

# What a Redis call raises when Redis is down, paused, out of memory or read-only: redis-py's errors
# (ConnectionError covers a full pool's "no connection available"), and OSError (which includes
# TimeoutError) from the socket underneath.
REDIS_FAULTS: tuple[type[BaseException], ...] = (RedisError, OSError)
UNAVAILABLE_RETRY_AFTER_S = 2
TAGS = ("generate", "chat", "completion")  # discriminator tags of /v1/jobs bodies: not field names


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

    def __init__(self, retry_after: int = 1, message: str = "Model is overloaded") -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class Forbidden(ApiError):
    status_code = 403
    error_type = "forbidden"
    openai_type = "permission_error"
    code = "forbidden"


class NotFound(ApiError):
    status_code = 404
    error_type = "not_found"
    openai_type = "invalid_request_error"
    code = "not_found"


class Conflict(ApiError):
    status_code = 409
    error_type = "conflict"
    openai_type = "invalid_request_error"
    code = "conflict"


class MethodNotAllowed(ApiError):
    status_code = 405
    error_type = "validation"
    openai_type = "invalid_request_error"
    code = "method_not_allowed"


class Unavailable(ApiError):
    """Redis (the job store) does not answer: nothing was lost, the client retries later."""

    status_code = 503
    error_type = "unavailable"
    openai_type = "server_error"
    code = "unavailable"

    def __init__(self, message: str, retry_after: int = UNAVAILABLE_RETRY_AFTER_S) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class GenerationError(ApiError):
    status_code = 500
    error_type = "generation"


def unavailable(exc: BaseException) -> Unavailable:
    """The client's view of a Redis failure: what failed and when to retry, not Redis's own words."""
    return Unavailable(f"the job store (Redis) is unavailable ({type(exc).__name__}): retry in "
                       f"{UNAVAILABLE_RETRY_AFTER_S} s")


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


def _describe(error: dict, path: str) -> tuple[str, str | None]:
    loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "header", "path")]
    if path.startswith("/v1/jobs") and loc and loc[0] in TAGS:
        loc = loc[1:]
    field = ".".join(loc)
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return (f"{field}: {message}" if field else message), (field or None)


def install(app: FastAPI) -> None:
    """Every exception a route can raise, rendered in the route's dialect."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return render(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        path = request.url.path
        if any(e.get("type") == "json_invalid" for e in errors):
            message, _ = _describe(errors[0], path)
            return render(MalformedRequest("the request body is not valid JSON: " + message), path)
        described = [_describe(e, path) for e in errors]
        error = ValidationError("; ".join(m for m, _ in described), param=described[0][1])
        return render(error, path)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return render(from_status(exc.status_code, str(exc.detail)), request.url.path)

    async def _redis_fault(request: Request, exc: Exception) -> JSONResponse:
        log.warning("Redis failed on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__,
                    exc)
        return render(unavailable(exc), request.url.path)

    for fault in REDIS_FAULTS:
        app.add_exception_handler(fault, _redis_fault)  # type: ignore[arg-type]

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return render(ApiError(f"internal error: {type(exc).__name__}"), request.url.path)
