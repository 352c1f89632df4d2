"""One run: send the workload on its arrival schedule (under a concurrency cap), with a progress
bar, and measure the client's own CPU time (client and server may share the cores)."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from conveyor.bench import client_jobs, client_openai, client_tgi
from conveyor.bench.arrival import schedule
from conveyor.bench.metrics import summarize
from conveyor.bench.options import BACKENDS, Options, RunConfig
from conveyor.bench.receiver import Receiver
from conveyor.bench.record import Record
from conveyor.bench.workloads import Request


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


async def _one(send: Callable[..., Awaitable[None]], client: aiohttp.ClientSession, req: Request,
               opts: Options, rec: Record, timeout_s: float) -> None:
    rec.prompt_tokens = req.prompt_len
    try:
        async with asyncio.timeout(timeout_s):
            await send(client, req, opts, rec)
    except TimeoutError:
        rec.fail("timeout", f"no end within {timeout_s:.0f} s")
    except aiohttp.ClientConnectorError as exc:
        rec.fail("connect", str(exc))
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
        rec.fail("stream_broken", str(exc))
    except aiohttp.ClientError as exc:
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
    # No connection cap; the per-request bound is _one's timeout (aiohttp's default total is 300 s).
    # aiohttp over httpx: its C HTTP parser takes a third of httpx's CPU per streamed token here
    # (docs/benchmarks.md, "conveyor bench"), and the client shares the cores with the server it measures.
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
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
