"""The FastAPI application: wiring, error mapping, and the service routes (/info, /health, ...)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException

from api import async_jobs, openai, tgi
from api.auth import Auth, load_api_keys
from api.chat_template import ChatTemplate
from api.errors import ApiError, MalformedRequest, ValidationError, from_status, render
from api.jobs import JobStore
from api.limits import BodyLimit
from api.metrics import ApiMetrics, RequestMetrics
from api.openapi import openapi_schema
from api.relay import Relay
from api.service import Service
from api.tokenizer import PromptTokenizer
from schemas.keys import Keys
from schemas.service import Ready
from schemas.settings import Settings
from schemas.tgi import Info
from telemetry import prom
from telemetry.tracing import Tracing
from webhooks.enqueue import WebhookQueue
from webhooks.signing import Secrets
from webhooks.ssrf import Allow

log = logging.getLogger(__name__)

VERSION = "0.1.0"
TAGS = ("generate", "chat", "completion")  # discriminator tags of /v1/jobs bodies: not field names


def _describe(error: dict, path: str) -> tuple[str, str | None]:
    loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "header", "path")]
    if path.startswith("/v1/jobs") and loc and loc[0] in TAGS:
        loc = loc[1:]
    field = ".".join(loc)
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return (f"{field}: {message}" if field else message), (field or None)


def _auth(settings: Settings) -> Auth:
    auth = Auth(load_api_keys(settings))
    if auth.open:
        log.warning("no API keys configured: the api is open, every caller is tenant 'default' (host %s%s)",
                    settings.host, "" if not settings.allow_unauthenticated else ", allow_unauthenticated")
    else:
        log.info("API keys configured: %d key(s)", auth.num_keys)
    return auth


async def ready_state(service: Service) -> Ready:
    """Redis answers and at least one worker heartbeat is live."""
    redis = service.jobs.redis
    try:
        await redis.ping()
    except (RedisError, OSError) as exc:
        return Ready(status="not_ready", redis=False, workers=0, reason=f"Redis does not answer: {exc}")
    workers = 0
    async for _key in redis.scan_iter(match=service.jobs.keys.workers_pattern, count=1000):
        workers += 1
    if workers == 0:
        return Ready(status="not_ready", redis=True, workers=0, reason="no worker heartbeat")
    return Ready(status="ready", redis=True, workers=workers)


def create_app(settings: Settings, model_dir: Path, model_id: str) -> FastAPI:
    if not settings.redis_url:
        raise ValueError("the api needs REDIS_URL (`conveyor serve` sets it for you)")
    auth = _auth(settings)
    secrets = Secrets.from_settings(settings)  # a ValueError names the setting that is wrong
    allow = Allow.parse(settings.webhook_allow)
    metrics = ApiMetrics()
    tracing = Tracing.from_settings(settings, "conveyor-api")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = Redis.from_url(settings.redis_url, decode_responses=True)  # type: ignore[arg-type]
        keys = Keys(settings.key_prefix)
        relay = Relay(redis, keys, on_lag=metrics.relay_lag.observe)
        metrics.sse_clients.set_function(lambda: relay.num_clients)
        webhooks = WebhookQueue(settings.redis_url or "", keys, settings)
        jobs = JobStore(redis, keys, settings, metrics, webhooks, tracing)
        await jobs.ensure_group()
        await relay.start()
        app.state.service = Service(
            settings=settings,
            tokenizer=PromptTokenizer(model_dir),
            jobs=jobs,
            relay=relay,
            model_id=model_id,
            chat_template=ChatTemplate.from_model_dir(model_dir),
            webhook_secrets=secrets,
            webhook_allow=allow,
        )
        try:
            yield
        finally:
            await relay.stop()
            await redis.aclose()
            webhooks.close()
            if tracing is not None:
                tracing.shutdown()

    app = FastAPI(
        title="Conveyor",
        version=VERSION,
        description="LLM text generation as a job system: TGI and OpenAI dialects, async jobs. Errors use "
        "TGI's shape `{error, error_type}`, and OpenAI's `{error: {message, type, param, code}}` on /v1.",
        lifespan=lifespan,
    )
    app.state.auth = auth
    app.add_middleware(BodyLimit, limit=settings.payload_limit)
    app.add_middleware(RequestMetrics, metrics=metrics, tracing=tracing)  # outermost: sees every answer

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

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return render(ApiError(f"internal error: {type(exc).__name__}"), request.url.path)

    app.include_router(tgi.router)
    app.include_router(openai.router)
    app.include_router(async_jobs.router)

    @app.get("/health", tags=["Service"], responses={200: {"description": "The process serves requests"}})
    async def health() -> Response:
        """Liveness only: 200 while the process serves requests, overloaded or not."""
        return Response(status_code=200)

    @app.get("/ready", tags=["Service"], response_model=Ready,
             responses={503: {"model": Ready, "description": "Redis or every worker is unavailable"}})
    async def ready(request: Request) -> JSONResponse:
        """Readiness: Redis answers and at least one worker's heartbeat is live."""
        state = await ready_state(request.app.state.service)
        return JSONResponse(state.model_dump(), status_code=200 if state.status == "ready" else 503)

    @app.get("/info", tags=["Service"], response_model=Info)
    async def info() -> Info:
        """Model and limits, in TGI's shape."""
        return Info(
            model_id=model_id,
            model_dtype="float32" if settings.device in ("cpu", "auto") else "bfloat16",
            model_device_type=settings.device,
            max_concurrent_requests=settings.max_concurrent_requests,
            max_best_of=settings.max_best_of,
            max_stop_sequences=settings.max_stop_sequences,
            max_input_tokens=settings.max_input_tokens,
            max_total_tokens=settings.max_total_tokens,
            max_top_n_tokens=settings.max_top_n_tokens,
            max_batch_prefill_tokens=settings.max_batch_prefill_tokens,
            max_batch_total_tokens=settings.max_batch_total_tokens,
            max_batch_size=settings.max_batch_size,
            max_waiting_tokens=settings.max_waiting_tokens,
            waiting_served_ratio=settings.waiting_served_ratio,
            version=VERSION,
        )

    @app.get("/metrics", tags=["Service"], response_class=Response,
             responses={200: {"content": {prom.CONTENT_TYPE: {}}, "description": "Prometheus text format"}})
    async def metrics_route(request: Request) -> Response:
        """Prometheus metrics of this api process (the workers serve their own: see the README)."""
        depth = await request.app.state.service.jobs.queue_depth()
        if depth is not None:
            metrics.jobs.labels("queued").set(depth[0])
            metrics.jobs.labels("running").set(depth[1])
        return Response(prom.render(metrics.registry), media_type=prom.CONTENT_TYPE)

    app.openapi = lambda: openapi_schema(app)  # type: ignore[method-assign]
    return app
