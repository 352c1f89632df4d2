"""A worker's /health (its Kubernetes liveness probe): 200 while the engine's step loop and the
asyncio loop make progress, idle ones included; 503 naming the loop that is stuck, although the
metrics thread that answers is fine. The stalls are real: the engine thread blocked inside a step
(a gate around the real engine's step), the asyncio loop blocked by a synchronous sleep."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from conveyor.engine.engine import Engine
from conveyor.launcher.redis_server import free_port
from conveyor.telemetry import prom
from conveyor.wire.job import JobStatus
from tests.readiness import await_until
from tests.worker.conftest import Fleet, Local

STALL_S = 3.0  # well above IDLE_TICK (1 s): an idle loop on a loaded machine stays within it


def health(url: str) -> tuple[int, str]:
    answer = httpx.get(url, timeout=5)
    return answer.status_code, answer.text


def gate_steps(engine: Engine) -> threading.Event:
    """A gate the engine thread passes before each step: cleared, the step loop hangs inside a step."""
    gate = threading.Event()
    gate.set()
    step = engine.step

    def gated() -> Any:
        gate.wait()
        return step()

    engine.step = gated  # type: ignore[method-assign]
    return gate


async def wait_for(url: str, want: int, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        status, text = await asyncio.to_thread(health, url)
        if status == want:
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"/health still {status} after {timeout}s: {text}")
        await asyncio.sleep(0.1)


async def test_health_follows_the_loops(local: Local, make_spec: Callable[..., Any]) -> None:
    engine = local.engine()
    gate = gate_steps(engine)
    async with local.worker("live", engine=engine, worker_stall_timeout=STALL_S) as worker:
        server = prom.serve(worker.metrics.registry, "127.0.0.1", 0, "worker_metrics_port",
                            health=worker.liveness.report)
        url = f"http://127.0.0.1:{server.server_address[1]}/health"
        try:
            await asyncio.sleep(STALL_S * 2.5)  # idle for longer than the bound: still live
            status, text = await asyncio.to_thread(health, url)
            assert (status, text) == (200, "ok: asyncio, engine live\n")

            gate.clear()  # the next step hangs
            job = await local.submit(make_spec([101, 2024, 318, 257], max_new_tokens=4))
            text = await wait_for(url, 503)
            assert text.startswith("stalled: engine loop made no progress for ") and "asyncio" not in text
            metrics = await asyncio.to_thread(httpx.get, url.replace("/health", "/metrics"), timeout=5)
            assert metrics.status_code == 200  # what the old probe asked: it never saw the hang

            gate.set()
            assert (await local.result(job, timeout=60)).status is JobStatus.SUCCEEDED
            await wait_for(url, 200)

            time.sleep(STALL_S * 1.5)  # noqa: ASYNC251 - the point: the asyncio loop is blocked
            status, text = health(url)  # still blocked: asked from this thread, answered by the server's
            assert status == 503 and text.startswith("stalled: asyncio loop made no progress"), text
            assert "engine" not in text.split("(")[0]
            await wait_for(url, 200)
        finally:
            gate.set()
            server.shutdown()
            server.server_close()


async def test_a_worker_process_serves_health_on_its_metrics_port(fleet: Fleet) -> None:
    port = free_port()  # picked just before the process binds it
    fleet.start("w-live", CONVEYOR_WORKER_METRICS_PORT=str(port))
    await fleet.wait_ready()
    url = f"http://127.0.0.1:{port}/health"

    async def answers() -> bool:
        try:
            return (await asyncio.to_thread(health, url))[0] == 200
        except httpx.TransportError:
            return False

    await await_until(answers, f"200 from {url}", fleet.procs, fleet.logs)
    status, text = await asyncio.to_thread(health, url)
    assert (status, text) == (200, "ok: asyncio, engine live\n")
