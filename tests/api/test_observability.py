"""Metrics, traces and logs of the real api and worker processes (tiny model): after a few requests,
the counters and histograms of both /metrics moved by exactly what those requests did; the OTLP
collector got one trace per request, api span → queue → worker → prefill/decode; the logs are JSON
lines that name the job."""

from __future__ import annotations

import json
import time

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.api.conftest import auth

TOKENS = (3, 5, 7)


def scrape(url: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def worker_url(service) -> str:  # type: ignore[no-untyped-def]
    return f"http://127.0.0.1:{service.metrics_ports['worker0']}/metrics"


def complete(service, n: int) -> httpx.Response:  # type: ignore[no-untyped-def]
    body = {"model": "tiny", "prompt": "Hello there, how are you", "max_tokens": n, "ignore_eos": True}
    r = httpx.post(service.base_url + "/v1/completions", json=body, headers=auth("alice"), timeout=60)
    assert r.status_code == 200, r.text
    return r


def idle_worker(service) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The worker's samples once it owns no job (earlier tests' jobs have ended)."""
    deadline = time.monotonic() + 30
    while (samples := scrape(worker_url(service)))["conveyor_worker_jobs"] != 0:
        assert time.monotonic() < deadline, "the worker still owns jobs"
        time.sleep(0.05)
    return samples


def test_api_and_worker_metrics_move_by_what_the_requests_did(tiny_service) -> None:  # type: ignore[no-untyped-def]
    api_before, worker_before = scrape(tiny_service.base_url + "/metrics"), idle_worker(tiny_service)
    usages = [complete(tiny_service, n).json()["usage"] for n in TOKENS]
    refused = httpx.post(tiny_service.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 0},
                         headers=auth("alice"), timeout=30)
    assert refused.status_code == 422
    deadline = time.monotonic() + 30  # the worker counts a job right after its final record
    while (worker := scrape(worker_url(tiny_service)))["tgi_request_success"] < worker_before[
            "tgi_request_success"] + len(TOKENS):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    api = scrape(tiny_service.base_url + "/metrics")

    def moved(samples: dict[str, float], before: dict[str, float], name: str) -> float:
        return samples.get(name, 0.0) - before.get(name, 0.0)

    # api: requests received and refused, their durations
    assert moved(api, api_before, "tgi_request_count") == len(TOKENS) + 1
    assert moved(api, api_before, 'tgi_request_failure{err="validation"}') == 1
    route = 'conveyor_http_request_duration_seconds_count{route="/v1/completions"}'
    assert moved(api, api_before, route) == len(TOKENS) + 1
    queued = [v for k, v in api.items() if k.startswith("conveyor_jobs{") and 'status="queued"' in k]
    assert queued == [0] and api["conveyor_sse_clients"] == 0  # one model, its queue empty
    # worker: per job, exactly what the answers say
    generated = sum(u["completion_tokens"] for u in usages)
    assert generated == sum(TOKENS)
    assert moved(worker, worker_before, "tgi_request_success") == len(TOKENS)
    assert moved(worker, worker_before, "tgi_request_generated_tokens_sum") == generated
    assert moved(worker, worker_before, "tgi_request_generated_tokens_count") == len(TOKENS)
    prompts = sum(u["prompt_tokens"] for u in usages)
    assert moved(worker, worker_before, "tgi_request_input_length_sum") == prompts
    for name in ("tgi_request_duration", "tgi_request_queue_duration", "tgi_request_inference_duration",
                 "tgi_request_mean_time_per_token_duration", "conveyor_time_to_first_token_seconds"):
        assert moved(worker, worker_before, f"{name}_count") == len(TOKENS), name
        assert moved(worker, worker_before, f"{name}_sum") > 0, name
    assert moved(worker, worker_before, 'conveyor_jobs_finished_total{status="succeeded"}') == len(TOKENS)
    # one prefill step per job (its prompt), then one decode step per further token, one job at a time
    assert moved(worker, worker_before, 'tgi_batch_inference_duration_count{method="prefill"}') == len(TOKENS)
    assert moved(worker, worker_before, 'tgi_batch_inference_duration_count{method="decode"}') == sum(
        n - 1 for n in TOKENS)
    assert worker["tgi_batch_current_size"] == 0 and worker["tgi_queue_size"] == 0
    assert worker['conveyor_kv_blocks{state="free"}'] > 0


def test_one_trace_per_request_from_the_api_to_the_engine(tiny_service, otlp_collector) -> None:  # type: ignore[no-untyped-def]
    job_id = complete(tiny_service, 4).headers["x-job-id"]
    names = {"POST /v1/completions", "conveyor.queue", "conveyor.worker.job", "conveyor.engine.prefill",
             "conveyor.engine.decode"}
    deadline = time.monotonic() + 30
    while True:
        spans = {}
        for request in otlp_collector.got("/v1/traces"):
            export = ExportTraceServiceRequest.FromString(request.body)
            for resource in export.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        spans[span.span_id] = span
        job = [s for s in spans.values() if any(a.key == "conveyor.job_id" and a.value.string_value == job_id
                                                for a in s.attributes)]
        trace_ids = {s.trace_id for s in job}
        mine = [s for s in spans.values() if s.trace_id in trace_ids]
        if {s.name for s in mine} >= names:
            break
        assert time.monotonic() < deadline, sorted(s.name for s in mine)
        time.sleep(0.1)
    assert len(trace_ids) == 1
    by_name = {s.name: s for s in mine}
    root = by_name["POST /v1/completions"]
    assert root.parent_span_id == b""
    assert by_name["conveyor.queue"].parent_span_id == root.span_id
    assert by_name["conveyor.worker.job"].parent_span_id == root.span_id
    for phase in ("conveyor.engine.prefill", "conveyor.engine.decode"):
        assert by_name[phase].parent_span_id == by_name["conveyor.worker.job"].span_id
    queue, job, decode = (by_name[n] for n in ("conveyor.queue", "conveyor.worker.job",
                                               "conveyor.engine.decode"))
    assert (queue.end_time_unix_nano <= job.start_time_unix_nano <= decode.start_time_unix_nano
            <= root.end_time_unix_nano)


def test_logs_are_json_lines_that_name_the_job(tiny_service) -> None:  # type: ignore[no-untyped-def]
    job_id = complete(tiny_service, 2).headers["x-job-id"]
    deadline = time.monotonic() + 60  # bounds a hang only: the line is written when the job ends
    while True:
        lines = {name: [json.loads(line) for line in (tiny_service.log_dir / f"{name}.log").read_text()
                        .splitlines() if line.startswith("{")] for name in ("api", "worker0")}
        worker_lines = [line for line in lines["worker0"] if line.get("job_id") == job_id]
        if any("succeeded" in line["message"] for line in worker_lines):
            break
        assert time.monotonic() < deadline, lines["worker0"][-5:]
        time.sleep(0.05)
    submitted = [line for line in lines["api"] if line.get("job_id") == job_id]
    assert submitted and submitted[0]["tenant"] == "alice" and submitted[0]["role"] == "api"
    assert {line["level"] for line in submitted} == {"INFO"} and "time" in submitted[0]
    assert all(line["role"] == "worker" and line["worker_id"].startswith("worker-")
               and line["tenant"] == "alice" for line in worker_lines)
