"""Live events run ahead of the event stream (a worker writes it every durable interval, publishes
every stream interval: conveyor/worker/coalesce.py). Against the real api with no worker: the test
plays the worker, and writes the event stream only when the relay's notice (keys.FOLLOWED on the
control channel) asks for it, and publishes live to the follower the record names, as
PublishLoop.followed does. A follower that missed live events fills the gap from the stream; a Last-
Event-ID a client saw live but the stream does not hold yet is served once the worker has written
it, not refused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import httpx
import pytest
from redis import Redis

from conveyor.jobqueue.keys import FOLLOWED, Keys, event_entry_id
from conveyor.wire.event_batch import dump_events
from conveyor.wire.job import EventToken, JobEvent, JobResult, JobStatus
from tests.api.conftest import auth, keys_of, publish_as_worker, redis_of
from tests.api.sse import events

BODY = {"inputs": "Hello", "parameters": {"max_new_tokens": 8}}


def token(i: int, final: bool = False) -> JobEvent:
    result = JobResult(status=JobStatus.SUCCEEDED, generated_text="x" * (i + 1), finish_reason="length")
    return JobEvent(index=i, token=EventToken(id=i, text="x"), final=final, result=result if final else None)


class PlayedWorker:
    """Writes a job's events to its stream and channel by hand; on each follow notice for the job,
    runs the next of `on_notice` (what the test's worker does when a relay asks)."""

    def __init__(self, redis: Redis, keys: Keys, job_id: str) -> None:
        self.redis, self.keys, self.job_id = redis, keys, job_id
        self.on_notice: list[Callable[[], None]] = []
        self.notices = 0
        self._heard = threading.Condition()
        self._closed = threading.Event()
        self._pubsub = redis.pubsub()
        self._pubsub.subscribe(keys.control_channel)
        self._pubsub.get_message(timeout=5)  # the subscribe confirmation
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def durable(self, *indices: int, final_at: int = -1) -> None:
        batch = [token(i, final=i == final_at) for i in indices]
        key = self.keys.events(self.job_id)
        self.redis.xadd(key, {"e": dump_events(batch)}, id=event_entry_id(indices[-1]))

    def live(self, *indices: int, final_at: int = -1) -> None:
        batch = dump_events([token(i, final=i == final_at) for i in indices])
        publish_as_worker(self.redis, self.keys, self.job_id, batch)

    def _listen(self) -> None:
        while not self._closed.is_set():
            message = self._pubsub.get_message(timeout=0.2)
            if message is not None and str(message["data"]).startswith(f"{FOLLOWED}{self.job_id} "):
                if self.on_notice:
                    self.on_notice.pop(0)()
                with self._heard:
                    self.notices += 1
                    self._heard.notify_all()

    def wait_notices(self, n: int) -> None:
        with self._heard:
            assert self._heard.wait_for(lambda: self.notices >= n, timeout=30), f"{self.notices} notices"

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        self._pubsub.close()


@pytest.fixture
def played(queue_service) -> Iterator[tuple[str, PlayedWorker]]:  # type: ignore[no-untyped-def]
    job_id = httpx.post(queue_service.base_url + "/v1/jobs", json=BODY, headers=auth("alice"),
                        timeout=30).json()["id"]
    with redis_of(queue_service) as redis:
        worker = PlayedWorker(redis, keys_of(queue_service), job_id)
        try:
            yield job_id, worker
        finally:
            worker.close()
            httpx.delete(queue_service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=30)


def follow(service, job_id: str, last_event_id: int | None = None) -> httpx.Response:  # type: ignore[no-untyped-def]
    headers = auth("alice") | ({} if last_event_id is None else {"Last-Event-ID": str(last_event_id)})
    return httpx.stream("GET", service.base_url + f"/v1/jobs/{job_id}/events", headers=headers, timeout=30)


def test_a_gap_in_live_events_is_filled_from_the_stream_the_worker_writes_when_asked(
        queue_service, played) -> None:  # type: ignore[no-untyped-def]
    job_id, worker = played
    worker.durable(0, 1)  # the worker's last durable write; 2 and 3 it still holds
    with follow(queue_service, job_id) as stream:
        assert stream.status_code == 200
        received = events(stream)
        assert [next(received)[0] for _ in range(2)] == [0, 1]  # from the stream
        worker.wait_notices(1)  # the follow's own notice (the mark is new)
        # Asked again, the worker writes what it holds, then goes on live (the relay may read the
        # stream before that write: then 5 shows a gap too, and the next read has 2-4).
        worker.on_notice.append(lambda: (worker.durable(2, 3, 4), worker.live(5)))
        worker.live(4)  # live from here on: 2 and 3 were never published, a gap
        assert [next(received)[0] for _ in range(4)] == [2, 3, 4, 5]
        worker.wait_notices(2)  # asked for the gap
        worker.durable(5, 6, final_at=6)
        worker.live(6, final_at=6)
        assert [index for index, _ in received] == [6]


def test_a_last_event_id_seen_live_waits_for_the_worker_to_write_it(queue_service, played) -> None:  # type: ignore[no-untyped-def]
    """The client saw 0-5 live from an api that then died; the stream holds 0-2. The api it comes back
    to asks the worker, which writes 3-5 (and publishes 6): the stream goes on from 6, no 422."""
    job_id, worker = played
    worker.durable(0, 1, 2)
    worker.on_notice.append(lambda: worker.durable(3, 4, 5))
    with follow(queue_service, job_id, last_event_id=5) as stream:
        assert stream.status_code == 200, stream.read()
        received = events(stream)
        worker.live(6, 7, final_at=7)
        assert [index for index, _ in received] == [6, 7]
    worker.wait_notices(1)
