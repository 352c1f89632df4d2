"""What every route needs: settings, tokenizer, job store and relay of this api process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, overload

from fastapi import Request

from api.chat_template import ChatTemplate
from api.jobs import JobStore
from api.relay import Relay
from api.tokenizer import PromptTokenizer
from schemas.job import JobEvent
from schemas.settings import Settings


@dataclass
class Service:
    settings: Settings
    tokenizer: PromptTokenizer
    jobs: JobStore
    relay: Relay
    model_id: str
    chat_template: ChatTemplate | None = None

    @overload
    def follow(self, job_id: str, request: Request) -> AsyncIterator[JobEvent]: ...
    @overload
    def follow(
        self, job_id: str, request: Request, keepalive: Literal[True]
    ) -> AsyncIterator[JobEvent | None]: ...

    async def follow(  # type: ignore[misc]
        self, job_id: str, request: Request, keepalive: bool = False
    ) -> AsyncIterator[JobEvent | None]:
        """The job's events until its final one. If the client goes away first (the task is
        cancelled), the job is cancelled: a sync or streaming request has no one left to serve."""
        finished = False
        try:
            async for event in self.relay.events(job_id):
                if event is None and not keepalive:
                    continue
                if event is not None and event.final:
                    finished = True
                yield event
                if finished:
                    return
        finally:
            if not finished:
                await asyncio.shield(self.jobs.cancel(job_id))
