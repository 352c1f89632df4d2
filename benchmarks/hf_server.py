"""The naive baseline for benchmarks/peers.py: Hugging Face `generate` behind a minimal OpenAI
`/v1/completions` server (streaming, `ignore_eos`, greedy).

    python -m benchmarks.hf_server MODEL_DIR --port 8200 [--batch-size 16]

Requests that wait when a batch starts (at most --batch-size) are run together as one padded static
batch (left padding; the batch runs to its longest output): what a user gets from `generate` with no
serving engine. --batch-size 1 serves one request at a time. fp32, all cores torch is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.streamers import BaseStreamer


@dataclass
class Job:
    ids: list[int]
    max_tokens: int
    ignore_eos: bool
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    sent: int = 0

    def push(self, token: int | None) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, token)


class RowStreamer(BaseStreamer):
    """Hands each step's token of row i to job i (the first put() is the prompt: skipped)."""

    def __init__(self, jobs: list[Job], eos: set[int]) -> None:
        self.jobs, self.eos, self.prompt_seen = jobs, eos, False
        self.done = [False] * len(jobs)

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        for i, token in enumerate(value.view(-1).tolist()):
            job = self.jobs[i]
            if self.done[i]:
                continue
            job.push(token)
            job.sent += 1
            if job.sent >= job.max_tokens or (not job.ignore_eos and token in self.eos):
                self.done[i] = True
                job.push(None)

    def end(self) -> None:
        for i, job in enumerate(self.jobs):
            if not self.done[i]:
                job.push(None)


class Batcher:
    def __init__(self, model_dir: str, batch_size: int) -> None:
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.tok.padding_side = "left"
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        self.pad = int(pad)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.eos = {int(self.tok.eos_token_id)} if self.tok.eos_token_id is not None else set()
        self.batch_size = batch_size
        self.waiting: list[Job] = []
        self.cv = threading.Condition()
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, job: Job) -> None:
        with self.cv:
            self.waiting.append(job)
            self.cv.notify()

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.waiting:
                    self.cv.wait()
                jobs, self.waiting = self.waiting[: self.batch_size], self.waiting[self.batch_size :]
            self._run(jobs)

    @torch.inference_mode()
    def _run(self, jobs: list[Job]) -> None:
        width = max(len(j.ids) for j in jobs)
        ids = torch.tensor([[self.pad] * (width - len(j.ids)) + j.ids for j in jobs])
        mask = torch.tensor([[0] * (width - len(j.ids)) + [1] * len(j.ids) for j in jobs])
        longest = max(j.max_tokens for j in jobs)
        ignore = all(j.ignore_eos for j in jobs)
        self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=longest,
                            min_new_tokens=longest if ignore else 0, do_sample=False,
                            pad_token_id=self.pad, streamer=RowStreamer(jobs, self.eos))


def app(batcher: Batcher) -> FastAPI:
    api = FastAPI()

    @api.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "hf-generate", "object": "model"}]}

    @api.post("/v1/completions")
    async def completions(request: Request) -> StreamingResponse:
        body = await request.json()
        prompt = body["prompt"]
        ids = prompt if isinstance(prompt, list) else batcher.tok.encode(prompt, add_special_tokens=False)
        job = Job(ids=list(ids), max_tokens=int(body.get("max_tokens") or 16),
                  ignore_eos=bool(body.get("ignore_eos")), loop=asyncio.get_running_loop())
        batcher.submit(job)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": "hf-generate"}

        async def chunks() -> Any:
            n = 0
            while (token := await job.out.get()) is not None:
                n += 1
                text = batcher.tok.decode([token])
                yield f"data: {json.dumps({**head, 'choices': [{'index': 0, 'text': text}]})}\n\n"
            usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return api


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir")
    p.add_argument("--port", type=int, default=8200)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()
    uvicorn.run(app(Batcher(args.model_dir, args.batch_size)), host="127.0.0.1", port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
