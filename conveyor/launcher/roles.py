"""One role per process: the api (uvicorn), an engine worker, or a webhook delivery process."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
from pathlib import Path

from conveyor.settings import Settings

log = logging.getLogger("conveyor")
# Seconds uvicorn lets requests finish after SIGTERM; the api pod's grace period covers its preStop
# sleep plus this (deploy/k8s/base/api.yaml).
API_SHUTDOWN_S = 5


def _model(settings: Settings, path: str | None = None):  # type: ignore[no-untyped-def]
    """The default model, or the model at `path` (one of `models`)."""
    from conveyor.engine.loader import ModelError, resolve_model

    try:
        return resolve_model(path or settings.model, settings.model_cache_dir)
    except ModelError as exc:
        raise SystemExit(f"conveyor: {exc}") from None


def catalog(settings: Settings, default: str):  # type: ignore[no-untyped-def]
    """The deployment's models (conveyor/jobqueue/models.py), or exit naming the setting to fix."""
    from conveyor.jobqueue.models import ModelCatalog

    try:
        return ModelCatalog.from_settings(settings, default)
    except ValueError as exc:
        raise SystemExit(f"conveyor: {exc}") from None


def run_api(settings: Settings) -> int:
    import uvicorn

    from conveyor.api.app import create_app

    if not settings.redis_url:
        raise SystemExit("conveyor api: set REDIS_URL (or use `conveyor serve`, which starts Redis)")
    source = _model(settings)
    models = catalog(settings, settings.served_model_name or source.model_id)
    # Each other model as a directory now (a .gguf converted once): the api loads its tokenizer
    # and chat template from there on the first request for it.
    models = dataclasses.replace(models, paths={name: str(_model(settings, path).path)
                                                for name, path in models.paths.items()})
    try:
        app = create_app(settings, source.path, models.default, models)
    except ValueError as exc:  # e.g. an unreadable api_keys_file
        raise SystemExit(f"conveyor api: {exc}") from None
    # log_config=None: uvicorn's lines go through our handler (human or JSON, like every other line).
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                timeout_graceful_shutdown=API_SHUTDOWN_S, log_config=None)
    return 0


def engine_config(settings: Settings):  # type: ignore[no-untyped-def]
    from conveyor.engine.config import EngineConfig

    return EngineConfig(
        block_size=settings.block_size,
        max_batch_prefill_tokens=settings.max_batch_prefill_tokens,
        max_batch_total_tokens=settings.max_batch_total_tokens,
        max_batch_size=settings.max_batch_size,
        admission_order=settings.admission_order,
        enable_prefix_caching=settings.enable_prefix_caching,
        kv_cache_memory=settings.kv_cache_bytes,
        kv_cache_fraction=settings.kv_cache_fraction,
        kv_cache_dtype=settings.kv_cache_dtype,
        device=settings.device,
        attention=settings.attention,
        gemm_dtype=settings.gemm_dtype,
        cuda_graphs=settings.cuda_graph_sizes(),
        speculate=settings.speculate,
        prompt_lookup_min=settings.prompt_lookup_min,
        prompt_lookup_max=settings.prompt_lookup_max,
    )


def step_time_model(settings: Settings):  # type: ignore[no-untyped-def]
    from conveyor.engine.sim_timing import GB, StepTimeModel

    return StepTimeModel(
        fixed_s=settings.sim_step_fixed_ms / 1000,
        weight_bytes=settings.sim_weight_gb * GB,
        kv_bytes_per_token=settings.sim_kv_bytes_per_token,
        memory_bandwidth=settings.sim_memory_bandwidth_gbs * GB,
        prefill_flops_per_token=settings.sim_prefill_gflop_per_token * GB,
        flops=settings.sim_tflops * 1e12,
        gpu_memory_bytes=settings.sim_gpu_memory_gb * GB,
    )


# Settings of the model's forward, which the simulated engine has none of.
MODEL_ONLY = ("device", "attention", "gemm_dtype", "kv_cache_dtype", "cuda_graphs", "speculate",
              "prompt_lookup_min", "prompt_lookup_max")


def ignored_settings(settings: Settings) -> list[str]:
    """Settings given away from their default that the chosen engine does not use."""
    if settings.engine == "sim":
        names = list(MODEL_ONLY)
    else:
        names = [name for name in Settings.model_fields if name.startswith("sim_")]
    return [name for name in names if getattr(settings, name) != Settings.model_fields[name].default]


def build_engine(settings: Settings, path: Path):  # type: ignore[no-untyped-def]
    """The model's engine, or with engine=sim the simulated one (no weights loaded)."""
    from conveyor.engine.engine import Engine

    for name in ignored_settings(settings):
        log.warning("--%s has no effect with --engine %s", name.replace("_", "-"), settings.engine)
    if settings.engine == "sim":
        from conveyor.engine.sim import SimEngine

        return SimEngine.from_model_dir(path, engine_config(settings), step_time_model(settings))
    return Engine.from_pretrained(path, engine_config(settings))


def run_worker(settings: Settings, worker_id: str | None) -> int:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from conveyor.engine.off_main import build_off_main
    from conveyor.launcher.heap import freeze_startup_heap
    from conveyor.telemetry import prom
    from conveyor.telemetry.logs import bind, redact
    from conveyor.telemetry.tracing import Tracing
    from conveyor.worker.outage import connect
    from conveyor.worker.runner import Worker, new_worker_id

    if not settings.redis_url:
        raise SystemExit("conveyor worker: set REDIS_URL (or use `conveyor serve`, which starts Redis)")
    worker_id = worker_id or new_worker_id()
    bind(worker_id=worker_id)
    # worker_model: one of `models` (its name and path), else the default model.
    source = _model(settings, settings.extra_models.get(settings.worker_model or ""))
    # Not on this thread: the engine thread steps it (conveyor/engine/off_main.py says why that costs ~20 %).
    engine = build_off_main(lambda: build_engine(settings, source.path))
    tracing = Tracing.from_settings(settings, "conveyor-worker")

    async def main() -> None:
        redis = connect(settings)  # its retry policy: conveyor/worker/outage.py
        worker = Worker(settings, engine, redis, worker_id, settings.served_model_name or source.model_id,
                        tracing)
        if settings.worker_metrics_port:
            prom.serve(worker.metrics.registry, settings.host, settings.worker_metrics_port,
                       "worker_metrics_port", health=worker.liveness.report)
            log.info("metrics on http://%s:%d/metrics, liveness on /health", settings.host,
                     settings.worker_metrics_port)
        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            if signals == 1:
                log.info("stopping: draining for up to %.0fs (signal again to exit now)",
                         settings.drain_timeout)
                worker.stop()
            else:  # its jobs stay pending; other workers resume them after the lease
                log.warning("second signal: exiting now")
                logging.shutdown()
                os._exit(1)

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        freeze_startup_heap("worker")  # the model and its engine are built: what serving makes is small
        try:
            await worker.run()
        except RedisConnectionError as exc:
            url = redact(settings.redis_url or "")
            raise SystemExit(f"conveyor worker: cannot reach Redis at {url} ({exc}): "
                             "start it, or point REDIS_URL at a running one") from None
        finally:
            await redis.aclose()
            if tracing is not None:
                tracing.shutdown()

    asyncio.run(main())
    return 0


def run_webhooks(settings: Settings) -> int:
    """An RQ worker on the webhook queue, with RQ's scheduler (it moves retries due back to the queue).
    SimpleWorker: deliveries run in this process, one at a time (`conveyor serve` starts
    `webhook_workers` of these), so their metrics live here too."""
    from redis import Redis
    from rq import Queue, SimpleWorker

    from conveyor.jobqueue.client import make_sync_client, rq_url
    from conveyor.jobqueue.keys import Keys
    from conveyor.launcher.redis_server import _die_with_parent
    from conveyor.telemetry import prom
    from conveyor.webhooks.delivery import Deliverer, install
    from conveyor.webhooks.metrics import DeliveryMetrics

    if not settings.redis_url:
        raise SystemExit("conveyor webhooks: set REDIS_URL (or use `conveyor serve`, which starts Redis)")
    metrics = DeliveryMetrics()
    try:
        deliverer = Deliverer(settings, make_sync_client(settings, decode_responses=True), metrics.attempt)
    except ValueError as exc:  # a bad secret or allow-list entry
        raise SystemExit(f"conveyor webhooks: {exc}") from None
    install(deliverer)
    os.register_at_fork(after_in_child=_die_with_parent)  # RQ's scheduler process must not outlive us
    if settings.webhook_metrics_port:
        prom.serve(metrics.registry, settings.host, settings.webhook_metrics_port, "webhook_metrics_port")
    url = rq_url(settings)
    if url is None:
        raise SystemExit("conveyor webhooks: RQ does not run on Redis Cluster: set "
                         "CONVEYOR_WEBHOOK_REDIS_URL to a plain Redis for the webhook queue (the api and "
                         "workers enqueue there)")
    connection = Redis.from_url(url)
    queue = Queue(Keys(settings.key_prefix).webhook_queue, connection=connection)
    log.info("delivering webhooks from RQ queue %s (metrics port %s)", queue.name,
             settings.webhook_metrics_port or "off")
    SimpleWorker([queue], connection=connection).work(with_scheduler=True,
                                                        logging_level=settings.log_level.upper())
    return 0
