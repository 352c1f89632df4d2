"""One role per process: the api (uvicorn) or an engine worker."""

from __future__ import annotations

import asyncio
import logging
import signal

from schemas.settings import Settings

log = logging.getLogger("conveyor")


def _model(settings: Settings):  # type: ignore[no-untyped-def]
    from engine.loader import ModelError, resolve_model

    try:
        return resolve_model(settings.model, settings.model_cache_dir)
    except ModelError as exc:
        raise SystemExit(f"conveyor: {exc}") from None


def run_api(settings: Settings) -> int:
    import uvicorn

    from api.app import create_app

    if not settings.redis_url:
        raise SystemExit("conveyor api: set REDIS_URL (or use `conveyor serve`, which starts Redis)")
    source = _model(settings)
    app = create_app(settings, source.path, settings.served_model_name or source.model_id)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                timeout_graceful_shutdown=5)
    return 0


def engine_config(settings: Settings):  # type: ignore[no-untyped-def]
    from engine.config import EngineConfig

    return EngineConfig(
        block_size=settings.block_size,
        max_batch_prefill_tokens=settings.max_batch_prefill_tokens,
        max_batch_total_tokens=settings.max_batch_total_tokens,
        max_batch_size=settings.max_batch_size,
        enable_prefix_caching=settings.enable_prefix_caching,
        kv_cache_memory=settings.kv_cache_bytes,
        kv_cache_fraction=settings.kv_cache_fraction,
        device=settings.device,
    )


def run_worker(settings: Settings, worker_id: str | None) -> int:
    from redis.asyncio import Redis

    from engine.engine import Engine
    from worker.service import Worker

    if not settings.redis_url:
        raise SystemExit("conveyor worker: set REDIS_URL (or use `conveyor serve`, which starts Redis)")
    source = _model(settings)
    engine = Engine.from_pretrained(source.path, engine_config(settings))

    async def main() -> None:
        redis = Redis.from_url(settings.redis_url, decode_responses=True)  # type: ignore[arg-type]
        worker = Worker(settings, engine, redis, worker_id)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        try:
            await worker.run()
        finally:
            await redis.aclose()

    asyncio.run(main())
    return 0
