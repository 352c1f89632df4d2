"""The FastAPI application: wiring, error mapping, and the service routes (/info, /health, ...)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.asyncio import Redis

from api import tgi
from api.chat_template import ChatTemplate
from api.errors import ApiError
from api.jobs import JobStore
from api.relay import Relay
from api.service import Service
from api.tokenizer import PromptTokenizer
from schemas.keys import Keys
from schemas.settings import Settings

log = logging.getLogger(__name__)

VERSION = "0.1.0"


def _error(status: int, message: str, error_type: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status, headers=headers)


def _describe(error: dict) -> str:
    loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
    return f"{loc}: {error.get('msg', 'invalid')}" if loc else str(error.get("msg", "invalid"))


def create_app(settings: Settings, model_dir: Path, model_id: str) -> FastAPI:
    if not settings.redis_url:
        raise ValueError("the api needs REDIS_URL (`conveyor serve` sets it for you)")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = Redis.from_url(settings.redis_url, decode_responses=True)  # type: ignore[arg-type]
        keys = Keys(settings.key_prefix)
        relay = Relay(redis, keys)
        await relay.start()
        app.state.service = Service(
            settings=settings,
            tokenizer=PromptTokenizer(model_dir),
            jobs=JobStore(redis, keys, settings.max_concurrent_requests, settings.result_ttl),
            relay=relay,
            model_id=model_id,
            chat_template=ChatTemplate.from_model_dir(model_dir),
        )
        try:
            yield
        finally:
            await relay.stop()
            await redis.aclose()

    app = FastAPI(
        title="Conveyor",
        version=VERSION,
        description="LLM text generation as a job system: TGI and OpenAI dialects, async jobs.",
        lifespan=lifespan,
    )

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status_code, exc.message, exc.error_type, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _error(400, "the request body is not valid JSON: " + _describe(errors[0]), "validation")
        return _error(422, "; ".join(_describe(e) for e in errors), "validation")

    app.include_router(tgi.router)

    @app.get("/health", tags=["Service"])
    async def health() -> Response:
        """Liveness: 200 while the process serves requests."""
        return Response(status_code=200)

    @app.get("/info", tags=["Service"])
    async def info() -> dict:
        """Model and limits, in TGI's shape."""
        return {
            "model_id": model_id,
            "model_sha": None,
            "model_dtype": "float32" if settings.device in ("cpu", "auto") else "bfloat16",
            "model_device_type": settings.device,
            "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": settings.max_concurrent_requests,
            "max_best_of": settings.max_best_of,
            "max_stop_sequences": settings.max_stop_sequences,
            "max_input_tokens": settings.max_input_tokens,
            "max_total_tokens": settings.max_total_tokens,
            "max_top_n_tokens": settings.max_top_n_tokens,
            "max_batch_prefill_tokens": settings.max_batch_prefill_tokens,
            "max_batch_total_tokens": settings.max_batch_total_tokens,
            "max_batch_size": settings.max_batch_size,
            "max_waiting_tokens": settings.max_waiting_tokens,
            "waiting_served_ratio": settings.waiting_served_ratio,
            "validation_workers": 1,
            "max_client_batch_size": 1,
            "router": "conveyor",
            "version": VERSION,
            "sha": None,
            "docker_label": None,
        }

    @app.get("/metrics", tags=["Service"])
    async def metrics() -> Response:
        """Prometheus metrics."""
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app
