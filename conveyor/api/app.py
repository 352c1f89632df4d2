"""The FastAPI application: wiring (context, middleware, error handlers, routers) and the service
routes (/health, /ready, /info, /metrics)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from conveyor.api import errors
from conveyor.api.auth import Auth, load_api_keys
from conveyor.api.batch.runner import BatchRunner
from conveyor.api.context import ApiContext
from conveyor.api.errors import REDIS_FAULTS
from conveyor.api.fleet import live_workers, ready_state
from conveyor.api.jobpath.relay import Relay
from conveyor.api.jobpath.store import JobStore
from conveyor.api.metrics import ApiMetrics, RequestMetrics
from conveyor.api.models import ModelRoutes, ServedModel
from conveyor.api.openapi import openapi_schema
from conveyor.api.redis_pool import api_redis
from conveyor.api.routes import admin, console, openai, tgi, tokenize
from conveyor.api.routes import jobs as job_routes
from conveyor.api.routes.batches import router as batches_router
from conveyor.api.routes.files import router as files_router
from conveyor.api.upload_limit import UploadLimit
from conveyor.jobqueue.depth import QueuePlace
from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.models import ModelCatalog
from conveyor.jobqueue.spread import check_spread
from conveyor.launcher.heap import freeze_startup_heap
from conveyor.settings import Settings
from conveyor.telemetry import prom
from conveyor.telemetry.logs import redact_values
from conveyor.telemetry.tracing import Tracing
from conveyor.webhooks.enqueue import webhook_queue
from conveyor.webhooks.signing import Secrets
from conveyor.webhooks.ssrf import Allow
from conveyor.wire.health import QueueDepth, Ready
from conveyor.wire.heartbeat import WorkerInfo
from conveyor.wire.tgi import Info

log = logging.getLogger(__name__)

try:
    VERSION = version("conveyor")  # one version: the package's
except PackageNotFoundError:  # run from a source tree that is not installed
    VERSION = "0.0.0"


def _auth(settings: Settings) -> Auth:
    keys = load_api_keys(settings)
    redact_values(keys)  # a key that reaches a log line by any path is masked there
    auth = Auth(keys)
    if auth.open:
        log.warning("no API keys configured: the api is open, every caller is tenant 'default' (host %s%s)",
                    settings.host, "" if not settings.allow_unauthenticated else ", allow_unauthenticated")
    else:
        log.info("API keys configured: %d key(s)", auth.num_keys)
    return auth


def model_runtime(settings: Settings, workers: list[WorkerInfo]) -> tuple[str, str]:
    """(dtype, device type) the model runs in: what the workers report (comma-separated if they
    differ), else what the settings decide (`auto` is decided by each worker: float32 on CPU,
    bfloat16 on CUDA)."""
    if workers:
        dtypes = sorted({w.dtype for w in workers if w.dtype})
        devices = sorted({w.device.split(":")[0] for w in workers if w.device})
        return ",".join(dtypes) or "unknown", ",".join(devices) or "unknown"
    if settings.device == "cpu":
        return "float32", "cpu"
    if settings.device.startswith("cuda"):
        return "bfloat16", "cuda"
    return "auto", settings.device


def create_app(settings: Settings, model_dir: Path, model_id: str,
               catalog: ModelCatalog | None = None) -> FastAPI:
    """The app serving `model_dir` as `model_id` (the default model) and the other models of
    `catalog` (conveyor/jobqueue/models.py; None: `model_id` alone)."""
    if not settings.redis_url:
        raise ValueError("the api needs REDIS_URL (`conveyor serve` sets it for you)")
    auth = _auth(settings)
    secrets = Secrets.from_settings(settings)  # a ValueError names the setting that is wrong
    redact_values([*secrets.by_tenant.values(), secrets.default or ""])
    allow = Allow.parse(settings.webhook_allow)
    metrics = ApiMetrics()
    tracing = Tracing.from_settings(settings, "conveyor-api")
    catalog = catalog or ModelCatalog(model_id)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = api_redis(settings)
        keys = Keys(settings.key_prefix, settings.jobs_shards)
        relay = Relay(redis, keys, on_lag=metrics.relay_lag.observe, keepalive_s=settings.sse_keepalive_s,
                      durable_wait_s=settings.durable_interval_ms / 1000 + 1.0)
        metrics.sse_clients.set_function(lambda: relay.num_clients)
        webhooks = webhook_queue(settings, keys)
        jobs = JobStore(redis, keys, settings, metrics, webhooks, tracing, follower=relay.api_id)
        await jobs.ensure_group(catalog.queues)
        await check_spread(redis, keys)
        await relay.start()
        app.state.context = ApiContext(
            settings=settings,
            jobs=jobs,
            relay=relay,
            models=ModelRoutes(catalog, ServedModel.load(model_id, None, model_dir)),
            webhook_secrets=secrets,
            webhook_allow=allow,
        )
        app.state.batch_runner = BatchRunner(app.state.context, metrics)
        app.state.batch_runner.start()  # advances the batches (conveyor/api/batch/runner.py)
        freeze_startup_heap("api")
        try:
            yield
        finally:
            await app.state.batch_runner.stop()
            await relay.stop()
            await redis.aclose()
            if webhooks is not None:
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
    app.add_middleware(UploadLimit, limit=settings.payload_limit, upload_limit=settings.max_batch_file_bytes)
    app.add_middleware(RequestMetrics, metrics=metrics, tracing=tracing)  # outermost: sees every answer

    errors.install(app)
    app.include_router(tgi.router)
    app.include_router(tokenize.router)
    app.include_router(openai.router)
    app.include_router(job_routes.router)
    app.include_router(files_router)
    app.include_router(batches_router)
    app.include_router(admin.router)
    app.include_router(console.router)

    @app.get("/health", tags=["Service"], response_class=Response,
             responses={200: {"description": "The process serves requests (no body)", "content": None}})
    async def health() -> Response:
        """Liveness only: 200 while the process serves requests, overloaded or not."""
        return Response(status_code=200)

    @app.get("/ready", tags=["Service"], response_model=Ready,
             responses={503: {"model": Ready, "description": "Redis refuses writes, relay down"}})
    async def ready(request: Request) -> JSONResponse:
        """Readiness: Redis accepts writes and the relay is subscribed (no SCAN: O(1) per probe). The
        live workers are counted in the body; with none the api stays ready (jobs wait for one)."""
        state = await ready_state(ApiContext.of(request))
        return JSONResponse(state.model_dump(), status_code=200 if state.status == "ready" else 503)

    @app.get("/info", tags=["Service"], response_model=Info)
    async def info(request: Request) -> Info:
        """Model and limits, in TGI's shape. The dtype and device are those the live workers report
        (with none known, what the settings decide: `auto` when each worker picks its own)."""
        dtype, device = model_runtime(settings, await live_workers(ApiContext.of(request)))
        return Info(
            model_id=model_id,
            model_dtype=dtype,
            model_device_type=device,
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

    @app.get("/queue", tags=["Service"], response_model=QueueDepth,
             responses={404: {"description": "`model` names no model of this service"},
                        503: {"description": "Redis does not answer"}})
    async def queue(request: Request, model: str | None = None) -> QueueDepth:
        """The jobs waiting and running in the whole queue, and the workers they want: what KEDA
        scales the workers on (docs/operations/scaling.md#autoscaling-keda). Unauthenticated, as
        `/metrics` is: counts only. `?model=NAME`: that model's queue (docs/operations/multi-model.md);
        none: the default model's."""
        ctx = ApiContext.of(request)
        queue = ctx.models.catalog.queue_of(ctx.models.name_of(model))
        waiting, running = await ctx.jobs.queue_depth(queue)
        return QueueDepth.of(waiting, running, settings.max_batch_size)

    @app.get("/metrics", tags=["Service"], response_class=Response,
             responses={200: {"content": {prom.CONTENT_TYPE: {"schema": {"type": "string"}}},
                              "description": "Prometheus text format"}})
    async def metrics_route(request: Request) -> Response:
        """Prometheus metrics of this api process (the workers serve their own: see
        docs/operations/observability.md). While Redis does not answer, the queue gauges are left out
        rather than shown stale."""
        ctx = ApiContext.of(request)
        catalog = ctx.models.catalog
        try:  # every configured model's queue, concurrently: a scrape costs one model's round trips
            read = await asyncio.gather(*(ctx.jobs.queue_places(catalog.queue_of(n)) for n in catalog.names))
            by_model: dict[str, list[QueuePlace]] | None = dict(zip(catalog.names, read, strict=True))
        except REDIS_FAULTS:
            by_model = None
        metrics.set_queue(by_model)
        return Response(prom.render(metrics.registry), media_type=prom.CONTENT_TYPE)

    app.openapi = lambda: openapi_schema(app)  # type: ignore[method-assign]
    return app
