"""OpenAI's Batch API against a real api + worker (tiny model), driven by the unchanged `openai`
client: upload → create → poll → results, interactive requests ahead of a batch's remaining lines,
limits, tenants, cancel, expiry, metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from conveyor.api.batch.runner import line_job_id
from conveyor.launcher.redis_server import EmbeddedRedis
from tests.api.conftest import auth, keys_of, redis_of, until
from tests.conftest import REPO, RunningService, start_service, stop_service
from tests.readiness import answers, wait_until

WINDOW = 8
MAX_FILE = 300_000
MAX_LINES = 400
ENDED = {"completed", "failed", "expired", "cancelled"}


@pytest.fixture(scope="module")
def batch_service(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
                  tiny_model_dir, keys_file) -> Iterator[RunningService]:  # type: ignore[no-untyped-def]
    running = start_service(tmp_path_factory.mktemp("batches"), services_redis.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir),
        "CONVEYOR_API_KEYS_FILE": str(keys_file),
        "CONVEYOR_KV_CACHE_MEMORY": "16MiB",
        "CONVEYOR_HEARTBEAT_INTERVAL_MS": "200",
        "CONVEYOR_JOB_LEASE_MS": "2000",
        "CONVEYOR_BATCH_WINDOW": str(WINDOW),
        "CONVEYOR_MAX_BATCH_FILE_BYTES": str(MAX_FILE),
        "CONVEYOR_MAX_BATCH_REQUESTS": str(MAX_LINES),
        "OMP_NUM_THREADS": "1",
    })
    yield running
    stop_service(running)


def client(service: RunningService, key: str = "key-alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=service.base_url + "/v1", api_key=key, max_retries=0, timeout=60)


def jsonl(lines: list[dict | str]) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def line(custom_id: str, body: dict, url: str = "/v1/completions") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def run_batch(c: openai.OpenAI, lines: list[dict | str], endpoint: str = "/v1/completions"):  # type: ignore[no-untyped-def]
    uploaded = c.files.create(file=("batch.jsonl", jsonl(lines)), purpose="batch")
    return c.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]


def wait_status(c: openai.OpenAI, batch_id: str, statuses: set[str], timeout: float = 240):  # type: ignore[no-untyped-def]
    return until(lambda: (b := c.batches.retrieve(batch_id)).status in statuses and b,
                 f"batch {batch_id} in {statuses}", timeout)


def content_lines(c: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in c.files.content(file_id).text.splitlines()]


def test_openai_client_end_to_end_equals_one_by_one(batch_service: RunningService) -> None:
    c = client(batch_service)
    lines: list[dict | str] = []
    for i in range(50):
        if i % 2:
            body = {"model": "tiny", "messages": [{"role": "user", "content": f"Name colour number {i}"}],
                    "max_tokens": 6, "temperature": 0, "logprobs": i % 5 == 1}
            lines.append(line(f"req-{i}", body, "/v1/chat/completions"))
        else:
            body = {"model": "tiny", "prompt": f"Once upon a time {i}", "max_tokens": 6, "temperature": 0,
                    "echo": i % 10 == 4}
            lines.append(line(f"req-{i}", body))
    lines[10] = '{"custom_id": "req-10", "method": "POST", not json'
    lines[31]["body"]["temperature"] = 3  # type: ignore[index]  # out of range: the endpoint answers 422
    uploaded = c.files.create(file=("mixed.jsonl", jsonl(lines)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.filename == "mixed.jsonl"
    batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                             completion_window="24h", metadata={"run": "e2e"})
    assert batch.status == "validating" and batch.metadata == {"run": "e2e"}
    done = wait_status(c, batch.id, ENDED)
    assert done.status == "completed", done
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (50, 48, 2)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    results = {x["custom_id"]: x for x in content_lines(c, done.output_file_id)}
    errors = {x["custom_id"]: x for x in content_lines(c, done.error_file_id)}
    assert len(results) == 48 and set(errors) == {None, "req-31"}
    assert errors[None]["error"]["code"] == "invalid_json" and errors[None]["response"] is None
    refused = errors["req-31"]["response"]
    assert refused["status_code"] == 422 and refused["body"]["error"]["param"] == "temperature"

    for i, x in enumerate(lines):
        if i in (10, 31):
            continue
        got = results[f"req-{i}"]
        assert got["error"] is None and got["response"]["status_code"] == 200
        assert got["id"].startswith("batch_req_") and got["response"]["request_id"]
        body = {k: v for k, v in x["body"].items() if k != "model"}  # type: ignore[index]
        if i % 2:
            alone = c.chat.completions.create(model="tiny", **body).model_dump()
        else:
            alone = c.completions.create(model="tiny", **body).model_dump()
        answer = got["response"]["body"]
        assert answer["object"] == alone["object"]
        assert answer["usage"]["completion_tokens"] == alone["usage"]["completion_tokens"]
        assert answer["usage"]["prompt_tokens"] == alone["usage"]["prompt_tokens"]
        [mine], [theirs] = answer["choices"], alone["choices"]
        assert mine["finish_reason"] == theirs["finish_reason"]
        if i % 2:
            assert mine["message"]["content"] == theirs["message"]["content"]
            if x["body"]["logprobs"]:  # type: ignore[index]
                tokens = [t["token"] for t in mine["logprobs"]["content"]]
                assert tokens == [t["token"] for t in theirs["logprobs"]["content"]] and tokens
        else:
            assert mine["text"] == theirs["text"]


def test_interactive_requests_start_before_the_batch_rest(batch_service: RunningService) -> None:
    c = client(batch_service)
    total = 300
    lines: list[dict | str] = [line(f"n{i}", {"prompt": f"item {i}", "max_tokens": 2, "temperature": 0,
                                              "ignore_eos": True}) for i in range(total)]
    batch = run_batch(c, lines)
    until(lambda: c.batches.retrieve(batch.id).request_counts.completed >= 3 * WINDOW, "batch under way")
    ids = []
    for i in range(4):
        r = httpx.post(batch_service.base_url + "/v1/jobs", headers=auth("alice"), timeout=30,
                       json={"prompt": f"interactive {i}", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    counts = c.batches.retrieve(batch.id).request_counts
    done_at_submit = counts.completed + counts.failed
    done = wait_status(c, batch.id, ENDED)
    assert done.status == "completed" and done.request_counts.completed == total

    keys = keys_of(batch_service)
    with redis_of(batch_service) as redis:
        def started(job_id: str) -> float:
            value = redis.hget(keys.job(job_id), "started_at")
            assert value is not None, job_id
            return float(value)

        batch_started = [started(line_job_id(batch.id, n)) for n in range(total)]
        for job_id in ids:
            mine = started(job_id)
            before = sum(1 for s in batch_started if s < mine)
            # only the lines already expanded when it was submitted (at most one window beyond those
            # done) started before it; all the rest of the batch started after it
            assert before <= done_at_submit + 2 * WINDOW, (before, done_at_submit)
            assert total - before >= total // 2


def test_upload_limits_name_the_setting(batch_service: RunningService) -> None:
    c = client(batch_service)
    row = line("x", {"prompt": "p" * 200, "max_tokens": 1})
    big = jsonl([{**row, "custom_id": f"x{i}"} for i in range(MAX_FILE // 250 + 40)])
    assert len(big) > MAX_FILE
    with pytest.raises(openai.APIStatusError) as err:
        c.files.create(file=("big.jsonl", big), purpose="batch")
    assert err.value.status_code == 413 and "max_batch_file_bytes" in str(err.value.body)
    many = jsonl([line(f"y{i}", {"prompt": "p", "max_tokens": 1}) for i in range(MAX_LINES + 1)])
    with pytest.raises(openai.UnprocessableEntityError) as err:
        c.files.create(file=("many.jsonl", many), purpose="batch")
    assert "max_batch_requests" in str(err.value.body)
    with pytest.raises(openai.UnprocessableEntityError) as err:
        c.files.create(file=("a.jsonl", jsonl([row])), purpose="fine-tune")
    assert err.value.body["param"] == "purpose"  # type: ignore[index]
    with pytest.raises(openai.UnprocessableEntityError):
        c.files.create(file=("a.jsonl", b"\xff\xfe not utf-8\n"), purpose="batch")


def test_batch_parameters_and_tenants(batch_service: RunningService) -> None:
    alice, bob = client(batch_service), client(batch_service, "key-bob")
    lines: list[dict | str] = [line("only", {"prompt": "hi", "max_tokens": 1, "temperature": 0})]
    uploaded = alice.files.create(file=("one.jsonl", jsonl(lines)), purpose="batch")
    with pytest.raises(openai.UnprocessableEntityError) as err:
        alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                             completion_window="1h")  # type: ignore[arg-type]
    assert err.value.body["param"] == "completion_window"  # type: ignore[index]
    with pytest.raises(openai.UnprocessableEntityError):
        alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        bob.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        bob.files.content(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        bob.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    batch = alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                 completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        bob.batches.cancel(batch.id)
    assert batch.id in [b.id for b in alice.batches.list(limit=5).data]
    assert batch.id not in [b.id for b in bob.batches.list().data]
    assert uploaded.id in [f.id for f in alice.files.list().data]
    assert alice.files.content(uploaded.id).text == jsonl(lines).decode()
    assert wait_status(alice, batch.id, ENDED).status == "completed"
    assert alice.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(uploaded.id)


def long_lines(n: int) -> list[dict | str]:
    return [line(f"l{i}", {"prompt": f"long {i}", "max_tokens": 24, "temperature": 0, "ignore_eos": True})
            for i in range(n)]


def test_cancel_cancels_what_has_not_run(batch_service: RunningService) -> None:
    c = client(batch_service)
    batch = run_batch(c, long_lines(120))
    until(lambda: c.batches.retrieve(batch.id).request_counts.completed >= 1, "a line done")
    cancelling = c.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_status(c, batch.id, ENDED)
    assert done.status == "cancelled" and done.cancelled_at
    out, errors = content_lines(c, done.output_file_id), content_lines(c, done.error_file_id)
    assert len(out) + len(errors) == 120 and len(out) == done.request_counts.completed < 120
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert c.batches.cancel(batch.id).status == "cancelled"  # ended: answered unchanged


def test_expiry_ends_the_rest_expired(batch_service: RunningService) -> None:
    c = client(batch_service)
    batch = run_batch(c, long_lines(120))
    until(lambda: c.batches.retrieve(batch.id).request_counts.completed >= 1, "a line done")
    with redis_of(batch_service) as redis:  # the 24 h window, run out now
        redis.hset(keys_of(batch_service).batch(batch.id), "expires_at", time.time() - 1)
    done = wait_status(c, batch.id, ENDED)
    assert done.status == "expired" and done.expired_at
    out, errors = content_lines(c, done.output_file_id), content_lines(c, done.error_file_id)
    assert len(out) + len(errors) == 120 and out
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


def test_metrics_and_openapi(batch_service: RunningService) -> None:
    c = client(batch_service)
    wait_status(c, run_batch(c, [line("m", {"prompt": "m", "max_tokens": 1})]).id, ENDED)
    text = httpx.get(batch_service.base_url + "/metrics", timeout=30).text
    assert 'conveyor_batches_total{status="completed"}' in text
    assert 'conveyor_batch_lines_total{outcome="completed"}' in text
    paths = httpx.get(batch_service.base_url + "/openapi.json", timeout=30).json()["paths"]
    for path, method in (("/v1/files", "post"), ("/v1/files/{file_id}/content", "get"),
                         ("/v1/batches", "post"), ("/v1/batches/{batch_id}/cancel", "post")):
        responses = paths[path][method]["responses"]
        assert "404" in responses or "413" in responses, (path, responses)
        schema = responses["401"]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("OpenAIErrorResponse")


def test_a_batch_goes_on_after_its_api_restarts(batch_service: RunningService) -> None:
    """Last in the module: it replaces the service's api process."""
    c = client(batch_service)
    batch = run_batch(c, long_lines(60))
    until(lambda: c.batches.retrieve(batch.id).request_counts.completed >= 1, "a line done")
    old = batch_service.processes["api"]
    old.terminate()
    old.wait(60)
    log = open(batch_service.log_dir / "api-restarted.log", "wb")  # noqa: SIM115 - closed with the process
    batch_service.processes["api"] = subprocess.Popen([sys.executable, "-m", "conveyor", "api"],
                                                      env=batch_service.env, cwd=REPO, stdout=log, stderr=log)
    wait_until(lambda: answers(batch_service.base_url + "/health"), "the new api answers /health",
               batch_service.processes, batch_service.logs)
    done = wait_status(c, batch.id, ENDED)
    assert done.status == "completed" and done.request_counts.completed == 60
    out = content_lines(c, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(f"l{i}" for i in range(60))  # each once
