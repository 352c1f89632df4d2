"""Conveyor's async-job API: POST /v1/jobs (a completion or chat body), then
- stream: follow GET /v1/jobs/{id}/events (TTFT at the first token event);
- poll: GET /v1/jobs/{id} every poll_interval_s until the job has ended (E2E only);
- webhook: ask for a `completed` webhook to the runner's local receiver; E2E = submit → webhook.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from conveyor.bench import client_openai
from conveyor.bench.options import Options
from conveyor.bench.receiver import Receiver
from conveyor.bench.record import Record
from conveyor.bench.sse import events, refusal
from conveyor.bench.workloads import Request

ENDED = {"succeeded", "failed", "cancelled", "expired"}


def body(req: Request, opts: Options) -> dict[str, Any]:
    out = client_openai.body(req, opts, chat=req.messages is not None)
    for key in ("stream", "stream_options"):
        out.pop(key)
    if opts.jobs_mode == "webhook":
        out["webhook"] = {"url": opts.webhook_url, "events": ["completed"]}
    return out


def _usage(result: dict[str, Any] | None, rec: Record) -> int:
    usage = (result or {}).get("usage") or {}
    rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
    return int(usage.get("completion_tokens", 0))


def _ended_badly(result: dict[str, Any] | None, rec: Record) -> bool:
    status = (result or {}).get("status")
    if status != "succeeded":
        rec.fail(f"job_{status}", (result or {}).get("error") or "")
        return True
    return False


async def send(client: aiohttp.ClientSession, req: Request, opts: Options, rec: Record,
               receiver: Receiver | None = None) -> None:
    rec.start()
    async with client.post(opts.base_url + "/v1/jobs", json=body(req, opts), headers=opts.headers) as r:
        if r.status != 202:
            return rec.fail(f"http_{r.status}", await r.text())
        job = await r.json()
    if opts.jobs_mode == "stream":
        return await _stream(client, opts, job["urls"]["events"], rec)
    if opts.jobs_mode == "poll":
        return await _poll(client, opts, job["urls"]["self"], rec)
    if receiver is None:
        raise ValueError("webhook mode needs the runner's receiver")
    data = await receiver.wait(job["id"])
    rec.webhook_latency = receiver.arrived_at(job["id"]) - rec._t0
    if not _ended_badly(data.get("result"), rec):
        rec.finish(_usage(data.get("result"), rec))
        rec.e2e = rec.webhook_latency


async def _stream(client: aiohttp.ClientSession, opts: Options, path: str, rec: Record) -> None:
    tokens = 0
    async with client.get(opts.base_url + path, headers=opts.headers) as r:
        if (refused := await refusal(r)) is not None:
            return rec.fail(*refused)
        async for event, data in events(r):
            if event == "error":
                return rec.fail("stream_error", data)
            payload = json.loads(data)
            if payload.get("token") is not None:
                rec.chunk()
                tokens += 1
            if payload.get("final"):
                if _ended_badly(payload.get("result"), rec):
                    return None
                return rec.finish(_usage(payload.get("result"), rec) or tokens)
    rec.fail("stream_error", "the event stream ended without its final event")


async def _poll(client: aiohttp.ClientSession, opts: Options, path: str, rec: Record) -> None:
    while True:
        async with client.get(opts.base_url + path, headers=opts.headers) as r:
            if r.status != 200:
                return rec.fail(f"http_{r.status}", await r.text())
            job = await r.json()
        if job.get("status") in ENDED:
            if not _ended_badly(job.get("result"), rec):
                rec.finish(_usage(job.get("result"), rec))
            return
        await asyncio.sleep(opts.poll_interval_s)
