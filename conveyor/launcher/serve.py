"""`conveyor serve`: the whole service on one machine, supervised.

Order: models (converted once, with progress) → Redis (embedded unless REDIS_URL) → workers
(`workers` for each model, docs/operations/multi-model.md), webhook processes (`conveyor webhooks`:
RQ workers with the scheduler), api. Worker i serves its metrics on worker_metrics_port + i (the
default model's first), webhook process i on webhook_metrics_port + i. A child that
dies is restarted with backoff while the others keep serving (supervisor.py); Ctrl-C, SIGTERM or a
child in a crash loop stops them all (SIGTERM, then SIGKILL once the workers' drain timeout and a
grace period have passed); the embedded Redis stops last, so nothing is orphaned.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from conveyor.launcher.redis_server import EmbeddedRedis, _die_with_parent
from conveyor.launcher.supervisor import Supervisor
from conveyor.settings import Settings

log = logging.getLogger("conveyor")

STOP_GRACE_S = 15.0  # beyond the workers' drain timeout: stopping the engine, handing jobs back


logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per readiness poll is noise


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)


def _wait_ready(url: str, supervisor: Supervisor, timeout: float = 600.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not supervisor.stopping:
        if supervisor.poll():  # a crash loop during start-up: the serve loop reports it
            return False
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def _port(base: int, i: int) -> str:
    return str(base + i if base else 0)


def _resolve_models(settings: Settings) -> Settings:
    """The settings with each of `models` as a model directory (a .gguf converted once, here, before
    any child starts), checked against the default model's name."""
    from conveyor.engine.loader import ModelError, resolve_model
    from conveyor.launcher.roles import catalog

    catalog(settings, settings.served_model_name or "")  # exits naming the setting to fix
    paths = {}
    for name, path in settings.extra_models.items():
        try:
            paths[name] = str(resolve_model(path, settings.model_cache_dir).path)
        except ModelError as exc:
            raise SystemExit(f"conveyor: models entry {name}: {exc}") from None
    if not paths:
        return settings
    return settings.model_copy(update={"models": ",".join(f"{n}={p}" for n, p in paths.items())})


def serve(settings: Settings) -> int:
    from conveyor.engine.loader import ModelError, resolve_model

    try:
        source = resolve_model(settings.model, settings.model_cache_dir)
    except ModelError as exc:
        raise SystemExit(f"conveyor: {exc}") from None
    settings = settings.model_copy(
        update={"model": str(source.path), "served_model_name": settings.served_model_name or source.model_id}
    )
    settings = _resolve_models(settings)
    redis: EmbeddedRedis | None = None
    if not settings.redis_url:
        redis = EmbeddedRedis(Path(settings.data_dir) / "redis").start()
        settings = settings.model_copy(update={"redis_url": redis.url})
        log.info("embedded Redis on %s (AOF, appendfsync everysec) in %s", redis.url, redis.data_dir)
    env = {**os.environ, **settings.to_env(), "REDIS_URL": settings.redis_url or ""}
    supervisor = Supervisor(env, _spawn)

    def on_signal(signum: int, _frame: object) -> None:
        if supervisor.stopping:  # second signal: stop now
            supervisor.kill_all()
        supervisor.stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    exe = [sys.executable, "-m", "conveyor"]
    code = 0
    try:
        # `workers` workers for each model: the default model's first, then each of `models`,
        # their metrics ports one after the other.
        for m, name in enumerate([None, *settings.extra_models]):
            for i in range(settings.workers):
                n = m * settings.workers + i
                label = f"worker-{i}" if name is None else f"worker-{name}-{i}"
                model = {"CONVEYOR_WORKER_MODEL": name} if name else {}
                supervisor.start(label, [*exe, "worker"],
                                 CONVEYOR_WORKER_METRICS_PORT=_port(settings.worker_metrics_port, n), **model)
        for i in range(settings.webhook_workers):
            supervisor.start(f"webhooks-{i}", [*exe, "webhooks"],
                             CONVEYOR_WEBHOOK_METRICS_PORT=_port(settings.webhook_metrics_port, i))
        supervisor.start("api", [*exe, "api"])
        base = f"http://{settings.host}:{settings.port}"
        if _wait_ready(base + "/health", supervisor):
            print(f"\nConveyor is serving {settings.served_model_name} on {base}\n"
                  f"  try: curl -N -X POST {base}/generate_stream -H 'Content-Type: application/json' "
                  "-d '{\"inputs\":\"What is the capital of France?\","
                  "\"parameters\":{\"max_new_tokens\":20}}'\n"
                  "  Ctrl-C stops everything.\n", file=sys.stderr, flush=True)
        while not supervisor.stopping:
            problem = supervisor.poll()
            if problem:
                log.error("%s: stopping the service", problem)
                code = 1
                break
            time.sleep(0.2)
    finally:
        supervisor.stop(settings.drain_timeout + STOP_GRACE_S)
        if redis is not None:
            redis.stop()
        log.info("stopped")
    return code
