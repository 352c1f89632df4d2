"""One run: send the workload on its arrival schedule (under a concurrency cap), with a progress
bar, and measure the client's own CPU time (client and server may share the cores)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench.loadgen import client_jobs, client_openai, client_tgi
from bench.loadgen.arrival import schedule
from bench.loadgen.metrics import summarize
from bench.loadgen.options import Options
from bench.loadgen.receiver import Receiver
from bench.loadgen.record import Record
from bench.loadgen.workloads import Request

BACKENDS = ("completions", "chat", "tgi", "jobs")


@dataclass(frozen=True)
class RunConfig:
    backend: str = "completions"
    rate: float = math.inf
    arrival: str = "poisson"
    seed: int = 0
    max_concurrency: int | None = None
    timeout_s: float = 3600.0
    progress: bool = True
    slo: dict[str, float] | None = None


def _sender(backend: str, receiver: Receiver | None) -> Callable[..., Awaitable[None]]:
    if backend == "completions":
        return client_openai.send
    if backend == "chat":
        return lambda c, q, o, r: client_openai.send(c, q, o, r, chat=True)
    if backend == "tgi":
        return client_tgi.send
    if backend == "jobs":
        return lambda c, q, o, r: client_jobs.send(c, q, o, r, receiver)
    raise ValueError(f"--backend is one of {', '.join(BACKENDS)}, not {backend!r}")


async def _one(send: Callable[..., Awaitable[None]], client: httpx.AsyncClient, req: Request,
               opts: Options, rec: Record, timeout_s: float) -> None:
    rec.prompt_tokens = req.prompt_len
    try:
        async with asyncio.timeout(timeout_s):
            await send(client, req, opts, rec)
    except TimeoutError:
        rec.fail("timeout", f"no end within {timeout_s:.0f} s")
    except httpx.ConnectError as exc:
        rec.fail("connect", str(exc))
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        rec.fail("stream_broken", str(exc))
    except httpx.HTTPError as exc:
        rec.fail(type(exc).__name__, str(exc))
    except ValueError as exc:  # a payload that is not the JSON the dialect promises
        rec.fail("bad_payload", str(exc))


async def run_async(requests: list[Request], opts: Options, cfg: RunConfig) -> dict[str, Any]:
    receiver = None
    if cfg.backend == "jobs" and opts.jobs_mode == "webhook":
        receiver = Receiver()
        await receiver.start()
        opts = dataclasses.replace(opts, webhook_url=receiver.url)
    send = _sender(cfg.backend, receiver)
    offsets = schedule(len(requests), cfg.rate, cfg.arrival, cfg.seed)
    records = [Record() for _ in requests]
    cap = asyncio.Semaphore(cfg.max_concurrency or len(requests) or 1)
    bar = _progress(len(requests), cfg.progress)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(cfg.timeout_s, connect=30.0)
    try:
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            cpu0, t0 = time.process_time(), time.perf_counter()

            async def go(i: int) -> None:
                delay = t0 + offsets[i] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                async with cap:
                    records[i].sent_at = time.perf_counter() - t0
                    await _one(send, client, requests[i], opts, records[i], cfg.timeout_s)
                if bar is not None:
                    bar.update(1)

            await asyncio.gather(*(go(i) for i in range(len(requests))))
            duration, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        if bar is not None:
            bar.close()
        if receiver is not None:
            await receiver.stop()
    summary = summarize(records, duration, cfg.slo, client_cpu_s=cpu)
    jobs_mode = opts.jobs_mode if cfg.backend == "jobs" else None
    summary["config"] = {"backend": cfg.backend, "jobs_mode": jobs_mode,
                         "base_url": opts.base_url, "rate": cfg.rate, "arrival": cfg.arrival,
                         "max_concurrency": cfg.max_concurrency, "seed": cfg.seed}
    summary["_records"] = records  # for the plots; dropped from the JSON
    return summary


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req", file=sys.stderr, leave=False)


def run(requests: list[Request], opts: Options, cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(run_async(requests, opts, cfg))
