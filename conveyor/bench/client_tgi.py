"""TGI-compatible streaming: POST /generate_stream; one token per event (`token`, and the last
event's `details.generated_tokens` when the server sends details). TGI has no ignore_eos: outputs may end
early at EOS, and the figures count the tokens that came."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from conveyor.bench.options import Options
from conveyor.bench.record import Record
from conveyor.bench.sse import events, refusal
from conveyor.bench.workloads import Request


def body(req: Request, opts: Options) -> dict[str, Any]:
    params: dict[str, Any] = {"max_new_tokens": req.output_len, "details": True, **req.extra}
    if opts.temperature > 0:
        params.update(do_sample=True, temperature=opts.temperature)
    prompt = req.prompt if isinstance(req.prompt, str) else " ".join(map(str, req.prompt))
    return {"inputs": prompt, "parameters": params}


async def send(client: aiohttp.ClientSession, req: Request, opts: Options, rec: Record) -> None:
    tokens = 0
    rec.start()
    async with client.post(opts.base_url + "/generate_stream", json=body(req, opts),
                           headers=opts.headers) as r:
        if (refused := await refusal(r)) is not None:
            return rec.fail(*refused)
        async for _event, data in events(r):
            payload = json.loads(data)
            if "error" in payload:
                return rec.fail("stream_error", data)
            if payload.get("token") is not None:
                rec.chunk()
                tokens += 1
            if details := payload.get("details"):
                tokens = details.get("generated_tokens", tokens)
    rec.finish(tokens)
