"""OpenAI-compatible streaming: POST /v1/completions or /v1/chat/completions with
stream_options.include_usage; TTFT at the first chunk with text, ITL between such chunks, output
tokens from the usage chunk (the count of content chunks when a server sends none)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from conveyor.bench.options import Options
from conveyor.bench.record import Record
from conveyor.bench.sse import events, refusal
from conveyor.bench.workloads import Request


def body(req: Request, opts: Options, chat: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"model": opts.model, "max_tokens": req.output_len, "temperature": opts.temperature,
                           "stream": True, "stream_options": {"include_usage": True}, **req.extra}
    if opts.ignore_eos:
        out["ignore_eos"] = True  # vLLM's and Conveyor's extension (--no-ignore-eos where refused)
    if chat:
        out["messages"] = req.messages or [{"role": "user", "content": req.prompt}]
    else:
        out["prompt"] = req.prompt
    return out


def _text(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


async def send(client: aiohttp.ClientSession, req: Request, opts: Options, rec: Record,
               chat: bool = False) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    chunks = 0
    rec.start()
    request = body(req, opts, chat)
    async with client.post(opts.base_url + path, json=request, headers=opts.headers) as r:
        if (refused := await refusal(r)) is not None:
            return rec.fail(*refused)
        async for event, data in events(r):
            if data.strip() == "[DONE]":
                break
            payload = json.loads(data)
            if event == "error" or "error" in payload:
                return rec.fail("stream_error", data)
            if any(_text(c, chat) for c in payload.get("choices") or []):
                rec.chunk()
                chunks += 1
            if usage := payload.get("usage"):
                rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
                rec.output_tokens = usage.get("completion_tokens", 0)
    rec.finish(rec.output_tokens or chunks)
