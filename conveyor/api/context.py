"""What every route of this api process needs (settings, models with their tokenizers and chat
templates, job store, relay, webhook checks), and the two ways a sync or streaming request waits on
its job."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request

from conveyor.api.errors import ApiError, GenerationError
from conveyor.api.jobpath.relay import Relay
from conveyor.api.jobpath.store import JobStore
from conveyor.api.models import ModelRoutes
from conveyor.api.requests.chat_template import ChatTemplate
from conveyor.api.requests.tokenizer import PromptTokenizer
from conveyor.settings import Settings
from conveyor.webhooks.signing import Secrets
from conveyor.webhooks.ssrf import Allow
from conveyor.wire.job import JobEvent

log = logging.getLogger(__name__)


class ClientGone(ApiError):
    """The client of a sync request disconnected; its job has been cancelled. (Nobody reads the
    answer: 499 is nginx's "client closed request", for the access log.)"""

    status_code = 499
    error_type = "cancelled"


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read: the next message is the end)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


@dataclass
class ApiContext:
    settings: Settings
    jobs: JobStore
    relay: Relay
    models: ModelRoutes  # which model a request asks for (conveyor/api/models.py)
    webhook_secrets: Secrets = field(default_factory=Secrets)
    webhook_allow: Allow = field(default_factory=Allow)
    api_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  # this process, in its probe key
    _background: set[asyncio.Task[None]] = field(default_factory=set)

    @staticmethod
    def of(request: Request) -> ApiContext:
        """The context of the app serving the request (set by the app's lifespan)."""
        context: ApiContext = request.app.state.context
        return context

    @property
    def model_id(self) -> str:
        """The default model's name: TGI's routes and requests without `model` run it."""
        return self.models.default.name

    @property
    def tokenizer(self) -> PromptTokenizer:
        """The default model's tokenizer (another model's: `models.route(name).tokenizer`)."""
        return self.models.default.tokenizer

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self.models.default.chat_template

    def cancel_soon(self, job_id: str) -> None:
        """Cancels the job without awaiting: safe from a task that is itself being cancelled."""
        task = asyncio.get_running_loop().create_task(self.jobs.cancel(job_id))
        self._background.add(task)
        task.add_done_callback(self._cancelled)

    def _cancelled(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("could not cancel a job whose client went away (%s: %s); its lease or deadline "
                        "ends it", type(exc).__name__, exc)

    async def follow(self, job_id: str) -> AsyncIterator[list[JobEvent] | None]:
        """The job's events until its final one, in the relay's batches, with None for keep-alive
        pauses. If the consumer stops first (its client went away), the job is cancelled: a sync or
        streaming request has no one left to serve. (Async jobs are followed through the relay
        directly.)"""
        finished = False
        try:
            async for batch in self.relay.batches(job_id):
                finished = batch is not None and batch[-1].final
                yield batch
                if finished:
                    return
        finally:
            if not finished:
                self.cancel_soon(job_id)

    async def collect(self, job_id: str, request: Request) -> list[JobEvent]:
        """Every event of the job, for a non-streaming answer. If the client disconnects first, the
        job is cancelled (its KV freed within a step) and ClientGone is raised."""

        async def gather() -> list[JobEvent]:
            return [e async for batch in self.follow(job_id) if batch is not None for e in batch]

        collecting = asyncio.create_task(gather())
        watching = asyncio.create_task(_disconnected(request))
        try:
            done, _ = await asyncio.wait({collecting, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not collecting.done():
                collecting.cancel()  # follow() cancels the job
        if collecting not in done:
            self.cancel_soon(job_id)  # also follow()'s on its way out; a second cancel is a no-op
            raise ClientGone(f"the client of job {job_id} went away: the job was cancelled")
        events = collecting.result()
        if not events or not events[-1].final:
            raise GenerationError("the event stream ended before the job did")
        return events
