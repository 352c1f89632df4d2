"""`Last-Event-ID` on `GET /v1/jobs/{id}/events` against the real api (no worker: the test writes
the job's events by hand, as a worker does). Past the last event of a job that has not ended:
422 naming the header and the job's last index, at once (it used to hang with no event and no
keep-alive). Past the end of an ended job: the stream ends at once."""

from __future__ import annotations

import httpx

from conveyor.jobqueue.keys import event_entry_id
from conveyor.wire.job import EventToken, JobEvent, JobResult, JobStatus
from tests.api.conftest import auth, keys_of, publish_as_worker, redis_of
from tests.api.sse import events

BODY = {"inputs": "Hello", "parameters": {"max_new_tokens": 5}}


def write_events(service, job_id: str, indices: range, final_at: int = -1) -> None:  # type: ignore[no-untyped-def]
    keys = keys_of(service)
    with redis_of(service) as redis:
        for i in indices:
            result = JobResult(status=JobStatus.SUCCEEDED, generated_text="x" * (i + 1),
                               finish_reason="length") if i == final_at else None
            data = JobEvent(index=i, token=EventToken(id=i, text="x"), final=i == final_at,
                            result=result).model_dump_json(exclude_none=True)
            redis.xadd(keys.events(job_id), {"e": data}, id=event_entry_id(i))
            publish_as_worker(redis, keys, job_id, f"[{data}]")


def open_events(service, job_id: str, last_event_id: int) -> httpx.Response:  # type: ignore[no-untyped-def]
    headers = {**auth("alice"), "Last-Event-ID": str(last_event_id)}
    return httpx.get(service.base_url + f"/v1/jobs/{job_id}/events", headers=headers, timeout=30)


def test_last_event_id_past_the_end_of_a_running_job_is_422(queue_service) -> None:  # type: ignore[no-untyped-def]
    job_id = httpx.post(queue_service.base_url + "/v1/jobs", json=BODY, headers=auth("alice"),
                        timeout=30).json()["id"]
    try:
        r = open_events(queue_service, job_id, 999_999_999_999)  # no event yet
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["param"] == "Last-Event-ID" and "its last index is -1" in error["message"]
        write_events(queue_service, job_id, range(4))  # running: events 0-3 so far
        r = open_events(queue_service, job_id, 999_999_999_999)
        assert r.status_code == 422 and "its last index is 3" in r.json()["error"]["message"], r.text
        assert open_events(queue_service, job_id, 4).status_code == 422
        headers = {**auth("alice"), "Last-Event-ID": "2"}
        with httpx.stream("GET", queue_service.base_url + f"/v1/jobs/{job_id}/events", headers=headers,
                          timeout=30) as stream:
            assert stream.status_code == 200
            received = events(stream)
            assert next(received)[0] == 3
            write_events(queue_service, job_id, range(4, 6), final_at=5)
            assert [index for index, _ in received] == [4, 5]
        ended = open_events(queue_service, job_id, 999_999_999_999)  # ended: the stream ends at once
        assert ended.status_code == 200 and list(events(ended)) == []
    finally:
        httpx.delete(queue_service.base_url + f"/v1/jobs/{job_id}", headers=auth("alice"), timeout=30)
