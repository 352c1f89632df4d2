"""A webhook that cannot be handed to RQ is logged at ERROR with its job's id, never swallowed: Redis
unavailable through every try, an RQ that refuses the call (as rq < 2.8 refuses `unique=`), a
notify after the queue was closed. Pure: no server (the Redis is a port nobody listens on)."""

from __future__ import annotations

import logging
import time

import pytest

import conveyor.webhooks.enqueue as enqueue
from conveyor.jobqueue.keys import Keys
from conveyor.launcher.redis_server import free_port
from conveyor.settings import Settings
from conveyor.webhooks.enqueue import WebhookQueue
from conveyor.wire.job import JobSpec, SamplingSpec, StoppingSpec, Webhook, webhook_id

pytestmark = pytest.mark.faults


def spec() -> JobSpec:
    return JobSpec(id=f"job{time.monotonic_ns()}", created_at=time.time(), prompt_ids=[1], tenant="acme",
                   stopping=StoppingSpec(max_new_tokens=1), sampling=SamplingSpec(),
                   webhook=Webhook(url="https://backend.example/hooks", events=["completed"]))


def queue(url: str) -> WebhookQueue:
    return WebhookQueue(url, Keys("enq"), Settings(redis_url=url, key_prefix="enq"))


def logged(caplog: pytest.LogCaptureFixture, job: JobSpec) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.ERROR and getattr(r, "job_id", None) == job.id
            and job.id in r.getMessage() and webhook_id(job.id, "completed") in r.getMessage()]


def test_redis_unavailable_through_every_try_is_logged(caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(enqueue, "FIRST_RETRY_S", 0.001)
    hooks, job = queue(f"redis://127.0.0.1:{free_port()}/0"), spec()  # nobody listens there
    hooks.notify(job, "completed")
    hooks.close()  # waits for the enqueue thread
    [record] = logged(caplog, job)
    assert f"Redis unavailable after {enqueue.ENQUEUE_TRIES} tries" in record.getMessage()


def test_an_rq_that_refuses_the_call_is_logged(caplog: pytest.LogCaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from rq import Queue

    def old_rq(*args: object, **kwargs: object) -> None:
        raise TypeError("enqueue_call() got an unexpected keyword argument 'unique'")

    monkeypatch.setattr(Queue, "enqueue_call", old_rq)
    hooks, job = queue(f"redis://127.0.0.1:{free_port()}/0"), spec()
    hooks.notify(job, "completed")
    hooks.close()
    [record] = logged(caplog, job)
    assert "TypeError" in record.getMessage() and "unique" in record.getMessage()
    assert record.exc_info is not None  # the traceback goes with it


def test_a_notify_after_close_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    hooks, job = queue(f"redis://127.0.0.1:{free_port()}/0"), spec()
    hooks.close()
    hooks.notify(job, "completed")  # a job ending while its worker shuts down
    [record] = logged(caplog, job)
    assert "closed" in record.getMessage()
