"""Many models, one queue (issue 41), against a real api and workers: two tiny models whose
vocabularies and chat templates differ (`twin` numbers the same tokens backwards and templates
chats its own way), a third configured model (`idle`) with no worker at first.

The token ids prove the routing: a job's prompt ids are its model's tokenizer and template applied
to the request, and the worker that ran it reports that model in its heartbeat."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.api.requests.chat_template import ChatTemplate
from conveyor.api.requests.tokenizer import PromptTokenizer
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.wire.heartbeat import WorkerInfo
from conveyor.wire.job import JobSpec, RecordField
from tests.api.conftest import keys_of, redis_of, until
from tests.conftest import RunningService, start_service, stop_service, write_twin

MESSAGES = [{"role": "user", "content": "Name a colour"}]


def spawn_worker(service: RunningService, name: str, model: str) -> None:
    """Starts worker `name` for `model` (worker_model) beside the service's others."""
    service.metrics_ports[name] = 0
    service.env["CONVEYOR_WORKER_MODEL"] = model
    try:
        service.spawn(name)
    finally:
        del service.env["CONVEYOR_WORKER_MODEL"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    twin = write_twin(tmp_path_factory.mktemp("twin") / "twin", tiny_model_dir)
    return {"tiny": tiny_model_dir, "twin": twin, "idle": twin}


@pytest.fixture(scope="module")
def models_service(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
                   dirs: dict[str, Path]) -> Iterator[RunningService]:
    """api + a worker of `tiny` (the default) + a worker of `twin`; `idle` has none."""
    running = start_service(tmp_path_factory.mktemp("models"), services_redis.url, {
        "CONVEYOR_MODEL": str(dirs["tiny"]),
        "CONVEYOR_SERVED_MODEL_NAME": "tiny",
        "CONVEYOR_MODELS": f"twin={dirs['twin']},idle={dirs['idle']}",
        "CONVEYOR_MODEL_ALIASES": "fast=twin",
        "CONVEYOR_KV_CACHE_MEMORY": "16MiB",
        "CONVEYOR_HEARTBEAT_INTERVAL_MS": "200",
        "CONVEYOR_JOB_LEASE_MS": "2000",
        "OMP_NUM_THREADS": "1",
    })
    try:
        spawn_worker(running, "worker1", "twin")
        running.wait_ready(2)
    except BaseException:
        stop_service(running)
        raise
    yield running
    stop_service(running)


def expected_ids(model_dir: Path, messages: list[dict] | None = None, prompt: str | None = None) -> list[int]:
    """The prompt ids the model's own tokenizer and template give."""
    template = ChatTemplate.from_model_dir(model_dir)
    text = prompt if prompt is not None else template.render(messages or [])  # type: ignore[union-attr]
    return PromptTokenizer(model_dir).encode(text)


def samples(url: str) -> dict[str, float]:
    """A /metrics page as {series: value}."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def job_of(service: RunningService, job_id: str) -> tuple[JobSpec, WorkerInfo | None, dict[str, str]]:
    """The job's spec, the heartbeat of the worker that ran it (None: not taken yet), its record."""
    keys = keys_of(service)
    with redis_of(service) as redis:
        record = redis.hgetall(keys.job(job_id))
        worker = record.get(RecordField.WORKER)
        beat = redis.get(keys.worker(worker)) if worker else None
    spec = JobSpec.model_validate_json(record[RecordField.SPEC])
    return spec, WorkerInfo.model_validate_json(beat) if beat else None, record


@pytest.mark.parametrize(("requested", "name"), [(None, "tiny"), ("tiny", "tiny"), ("twin", "twin"),
                                                 ("fast", "twin")])
def test_each_chat_runs_on_a_worker_of_its_model(models_service: RunningService, dirs: dict[str, Path],
                                                 requested: str | None, name: str) -> None:
    body = {"messages": MESSAGES, "max_tokens": 4, "temperature": 0,
            **({"model": requested} if requested else {})}
    r = httpx.post(models_service.base_url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == name
    spec, worker, _ = job_of(models_service, r.headers["X-Job-Id"])
    assert spec.prompt_ids == expected_ids(dirs[name], MESSAGES)
    assert spec.model == (None if name == "tiny" else name)
    assert worker is not None and worker.model == name
    assert worker.aliases == (["fast"] if name == "twin" else [])


def test_the_models_tokenize_differently(dirs: dict[str, Path]) -> None:
    """What makes the test above a proof: another vocabulary and another template."""
    assert expected_ids(dirs["tiny"], MESSAGES) != expected_ids(dirs["twin"], MESSAGES)
    hello = "Hello world"
    assert expected_ids(dirs["tiny"], prompt=hello) != expected_ids(dirs["twin"], prompt=hello)


def test_completions_use_the_models_tokenizer(models_service: RunningService, dirs: dict[str, Path]) -> None:
    body = {"model": "twin", "prompt": "Hello world", "max_tokens": 3, "temperature": 0}
    r = httpx.post(models_service.base_url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    spec, worker, _ = job_of(models_service, r.headers["X-Job-Id"])
    assert spec.prompt_ids == expected_ids(dirs["twin"], prompt="Hello world")
    assert worker is not None and worker.model == "twin"


def test_an_unknown_model_is_404_in_openais_shape(models_service: RunningService) -> None:
    base = models_service.base_url
    for path, body in (("/v1/chat/completions", {"model": "nope", "messages": MESSAGES}),
                       ("/v1/completions", {"model": "nope", "prompt": "Hi"}),
                       ("/v1/jobs", {"model": "nope", "prompt": "Hi"})):
        r = httpx.post(base + path, json=body, timeout=30)
        assert r.status_code == 404, (path, r.text)
        error = r.json()["error"]
        assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model",
                                                                  "invalid_request_error")
    assert httpx.get(base + "/v1/models/nope", timeout=30).json()["error"]["code"] == "model_not_found"
    assert httpx.get(base + "/queue?model=nope", timeout=30).status_code == 404


def test_models_lists_the_configured_models_and_aliases(models_service: RunningService) -> None:
    listed = httpx.get(models_service.base_url + "/v1/models", timeout=30).json()
    assert listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == ["tiny", "twin", "idle", "fast"]
    assert all(m["object"] == "model" for m in listed["data"])
    assert httpx.get(models_service.base_url + "/v1/models/fast", timeout=30).json()["id"] == "fast"


def test_a_batch_mixes_models(models_service: RunningService) -> None:
    base = models_service.base_url
    lines = [{"custom_id": f"req-{model}", "method": "POST", "url": "/v1/completions",
              "body": {"model": model, "prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}}
             for model in ("tiny", "twin", "fast")]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    uploaded = httpx.post(base + "/v1/files", files={"file": ("mixed.jsonl", data)},
                          data={"purpose": "batch"}, timeout=30).json()
    batch = httpx.post(base + "/v1/batches", json={
        "input_file_id": uploaded["id"], "endpoint": "/v1/completions", "completion_window": "24h"},
        timeout=30).json()
    done = until(lambda: (b := httpx.get(f"{base}/v1/batches/{batch['id']}", timeout=30).json())["status"]
                 in {"completed", "failed", "expired", "cancelled"} and b, "the batch ends", 240)
    assert done["status"] == "completed", done
    content = httpx.get(f"{base}/v1/files/{done['output_file_id']}/content", timeout=30).text
    out = {x["custom_id"]: x["response"] for x in map(json.loads, content.splitlines())}
    assert {cid: r["body"]["model"] for cid, r in out.items()} == {
        "req-tiny": "tiny", "req-twin": "twin", "req-fast": "twin"}
    for cid, response in out.items():
        _, worker, _ = job_of(models_service, response["request_id"])
        assert worker is not None and worker.model == response["body"]["model"], cid


def test_a_job_for_a_model_without_workers_waits_then_runs(models_service: RunningService,
                                                           dirs: dict[str, Path]) -> None:
    base = models_service.base_url
    body = {"model": "idle", "messages": MESSAGES, "max_tokens": 3, "temperature": 0}
    r = httpx.post(base + "/v1/jobs", json=body, timeout=30)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert httpx.get(f"{base}/queue?model=idle", timeout=30).json()["waiting"] == 1
    assert httpx.get(f"{base}/v1/jobs/{job_id}", timeout=30).json()["status"] == "queued"
    # The api's queue gauges count each configured model's queue, under its name and no other.
    api = samples(base)
    assert api['conveyor_jobs{model="idle",status="queued"}'] == 1
    assert api['conveyor_queue_jobs{band="normal",model="idle",shard="0",status="queued"}'] == 1
    labelled = {k.split('model="')[1].split('"')[0] for k in api if k.startswith("conveyor_jobs{")}
    assert labelled == {"tiny", "twin", "idle"}
    spawn_worker(models_service, "worker2", "idle")
    until(lambda: httpx.get(f"{base}/v1/jobs/{job_id}", timeout=30).json()["status"] == "succeeded",
          "the idle model's job runs once its worker starts", 240)
    spec, worker, _ = job_of(models_service, job_id)
    assert spec.model == "idle" and spec.prompt_ids == expected_ids(dirs["idle"], MESSAGES)
    assert worker is not None and worker.model == "idle"


def test_each_worker_names_its_model_in_its_metrics(models_service: RunningService) -> None:
    for name, model in (("worker0", "tiny"), ("worker1", "twin")):
        port = models_service.metrics_ports[name]
        assert samples(f"http://127.0.0.1:{port}")[f'conveyor_worker_info{{model="{model}"}}'] == 1, name
