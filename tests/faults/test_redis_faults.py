"""Redis itself fails under load: killed (SIGKILL) and restarted on the same port from its AOF, or
paused (SIGSTOP) for longer than a request timeout and resumed. The api and the workers are not
restarted. The promises: no job is lost or stuck; every stream resumes with no gap and no
duplicate, or ends with an error event — never silence; requests during the outage answer 503 with
Retry-After (never another 5xx; /health stays 200); afterwards the same processes serve again."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest

from conveyor.wire.job import RecordField
from tests.api.conftest import until
from tests.faults.clients import Followed, events_url, follow, headers, result_text, submit, text_of
from tests.faults.conftest import Cluster

pytestmark = [pytest.mark.faults, pytest.mark.slow]

N = 600
TGI = {"inputs": "Count forever", "parameters": {"max_new_tokens": N}}
COMPLETION = {"prompt": "Once upon a time", "max_tokens": N, "ignore_eos": True, "temperature": 0}
CHAT = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": N, "ignore_eos": True,
        "temperature": 0, "stream": True}
SMALL_TGI = {"inputs": "hi", "parameters": {"max_new_tokens": 8}}
PAUSE_S = 12  # longer than the api's 10 s wait for a subscription and any socket timeout of a request
FULL_S = 6  # Redis at maxmemory: several heartbeats and many engine steps, well inside the lease


@pytest.fixture(scope="module")
def cluster(cluster_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return cluster_factory(2)


@dataclass
class Load:
    """Jobs in flight when the fault comes, by how their clients wait."""

    pool: ThreadPoolExecutor
    streams: list[tuple[str, Followed, Future[Followed]]] = field(default_factory=list)  # dialect, seen
    followed_jobs: dict[int, str] = field(default_factory=dict)  # id(Followed) → job id, /v1/jobs streams
    polled: list[str] = field(default_factory=list)  # async jobs nobody follows
    sync: list[Future[httpx.Response]] = field(default_factory=list)  # /generate, waiting for the answer


def start_load(c: Cluster) -> Load:
    load = Load(ThreadPoolExecutor(16))

    def stream(dialect: str, method: str, url: str, body: dict | None = None) -> Followed:
        seen = Followed()
        load.streams.append((dialect, seen, load.pool.submit(follow, method, url, json_body=body, into=seen,
                                                             timeout=240)))
        return seen

    for _ in range(3):
        job_id = submit(c.url, COMPLETION).json()["id"]
        load.followed_jobs[id(stream("job", "GET", events_url(c.url, job_id)))] = job_id
        load.polled.append(submit(c.url, COMPLETION).json()["id"])
    for _ in range(2):
        stream("tgi", "POST", c.url + "/generate_stream", TGI)
        stream("chat", "POST", c.url + "/v1/chat/completions", CHAT)
        load.sync.append(load.pool.submit(httpx.post, c.url + "/generate", json=TGI, headers=headers(),
                                          timeout=240))
    until(lambda: all(len(seen.events) >= 5 for _d, seen, _f in load.streams), "every stream under way")
    assert all(not f.done() for _d, _s, f in load.streams), "a stream ended before the fault: make N larger"
    return load


@dataclass
class Probe:
    what: str
    status: int | None
    retry_after: str | None
    seconds: float
    error: str | None = None


def probe_during(c: Cluster, job_id: str, outage: Callable[[], None]) -> list[Probe]:
    """Requests sent while Redis is away (each answered, or not, in its own thread), then `outage`
    ends the fault; returns what each request got."""
    requests = [("POST /v1/jobs", "POST", "/v1/jobs", COMPLETION),
                ("GET /v1/jobs/{id}", "GET", f"/v1/jobs/{job_id}", None),
                ("POST /generate", "POST", "/generate", SMALL_TGI),
                ("GET /health", "GET", "/health", None), ("GET /ready", "GET", "/ready", None)]

    def one(what: str, method: str, path: str, body: dict | None) -> Probe:
        started = time.monotonic()
        try:
            r = httpx.request(method, c.url + path, json=body, headers=headers(), timeout=60)
            return Probe(what, r.status_code, r.headers.get("retry-after"), time.monotonic() - started)
        except httpx.HTTPError as exc:
            return Probe(what, None, None, time.monotonic() - started, f"{type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(len(requests)) as pool:
        futures = [pool.submit(one, *r) for r in requests]
        outage()
        return [f.result() for f in futures]


def probe_problems(probes: list[Probe]) -> list[str]:
    out = []
    for p in probes:
        if p.what == "GET /health":
            if p.status != 200:
                out.append(f"{p.what} answered {p.status} {p.error or ''} in the outage: liveness is 200")
        elif p.what == "GET /ready":
            if p.status not in (200, 503):  # 200: answered once the outage was over
                out.append(f"{p.what} answered {p.status} {p.error or ''} in the outage: readiness is 503")
        elif p.status is None:
            out.append(f"{p.what}: no answer during the outage ({p.error}, {p.seconds:.1f}s)")
        elif p.status >= 500 and not (p.status == 503 and p.retry_after):
            out.append(f"{p.what} answered {p.status} (Retry-After {p.retry_after}): not 503 + Retry-After")
    return out


def recovered(c: Cluster, pids: dict[str, int], load: Load) -> list[str]:
    """Every job of the load ended, every client got the rest or an error event, same processes."""
    out: list[str] = []
    for dialect, _seen, future in load.streams:
        seen = future.result(timeout=300)
        if seen.status != 200:
            out.append(f"{dialect} stream: HTTP {seen.status} {seen.body[:200]}")
            continue
        out += [f"{dialect} stream of job {seen.job_id}: {p}" for p in seen.problems()]
        job_id = seen.job_id or _stream_job(load, seen)
        record = c.wait_terminal(job_id)
        if seen.end == "final" and dialect != "chat":
            if len(seen.indices()) != N or text_of(seen) != result_text(record):
                out.append(f"{dialect} stream of job {job_id}: {len(seen.indices())} of {N} tokens, or text "
                           "unlike the job's result")
        elif seen.end == "done" and _chat_text(seen) != result_text(record):
            out.append(f"chat stream of job {job_id}: text unlike the job's result")
    for future in load.sync:
        try:
            r = future.result(timeout=300)
        except httpx.HTTPError as exc:
            out.append(f"/generate: no answer ({type(exc).__name__}: {exc})")
            continue
        if r.status_code == 200:
            record = c.wait_terminal(r.headers["x-job-id"])
            if r.json()["generated_text"] != result_text(record):
                out.append("/generate: text unlike the job's result")
        elif not (r.status_code == 503 and r.headers.get("retry-after")):
            out.append(f"/generate answered {r.status_code}: {r.text[:200]}")
    for job_id in load.polled:
        status = c.wait_terminal(job_id)[RecordField.STATUS]
        if status != "succeeded":
            out.append(f"async job {job_id} ended {status}")
    load.pool.shutdown()
    with c.redis() as r:
        pending = sum(r.xpending(s, "workers")["pending"] for s in c.keys.jobs_streams)  # type: ignore[index]
        queued, dead = sum(r.xlen(s) for s in c.keys.jobs_streams), r.xlen(c.keys.dead_letter_stream)
    if (pending, queued, dead) != (0, 0, 0):
        out.append(f"left behind: {pending} pending, {queued} in the jobs stream, {dead} dead-lettered")
    now = {name: proc.pid for name, proc in _processes(c).items() if proc.poll() is None}
    if now != pids:
        out.append(f"processes changed: {pids} -> {now}")
    return out


def serves_again(c: Cluster) -> list[str]:
    """The same api and workers answer new requests: async (relay live path), sync, streaming."""
    until(lambda: httpx.get(c.url + "/ready", timeout=10).status_code == 200, "ready after the outage")
    out = []
    small = {"prompt": "Again", "max_tokens": 40, "ignore_eos": True, "temperature": 0}

    def retrying(call: Callable[[], httpx.Response]) -> httpx.Response:
        deadline = time.monotonic() + 30
        while (r := call()).status_code == 503 and "retry-after" in r.headers and time.monotonic() < deadline:
            time.sleep(float(r.headers["retry-after"]))
        return r

    r = retrying(lambda: submit(c.url, small))
    if r.status_code != 202:
        return [f"POST /v1/jobs after the outage: {r.status_code} {r.text[:200]}"]
    seen = follow("GET", events_url(c.url, r.json()["id"]), timeout=60)
    if seen.problems() or seen.end != "final" or len(seen.indices()) != 40:
        out.append(f"/v1/jobs events after the outage: {seen.problems()} {seen.end} {len(seen.indices())}")
    r = retrying(lambda: httpx.post(c.url + "/generate", json=SMALL_TGI, headers=headers(), timeout=60))
    if r.status_code != 200:
        out.append(f"/generate after the outage: {r.status_code} {r.text[:200]}")
    seen = follow("POST", c.url + "/generate_stream", json_body=SMALL_TGI, timeout=60)
    if seen.end != "final" or seen.problems():
        out.append(f"/generate_stream after the outage: {seen.end} {seen.problems()}")
    return out


def _processes(c: Cluster) -> dict[str, subprocess.Popen[bytes]]:
    return {**c.fleet.procs, **{f"api{i}": api.processes["api"] for i, api in enumerate(c.apis)}}


def _stream_job(load: Load, seen: Followed) -> str:
    return load.followed_jobs[id(seen)]


def _chat_text(seen: Followed) -> str:
    return "".join(d["choices"][0]["delta"].get("content") or "" for _i, d in seen.events
                   if d.get("choices"))


def report(name: str, probes: list[Probe], problems: list[str], c: Cluster) -> str:
    lines = [f"{name}: requests during the outage"]
    lines += [f"  {p.what:<20} {p.status or p.error} Retry-After={p.retry_after} in {p.seconds:.1f}s"
              for p in probes]
    lines += ["problems:", *(f"  {p}" for p in problems)] if problems else ["no problem"]
    text = "\n".join(lines)
    print(text)
    return text + ("\n" + c.logs()[-6000:] if problems else "")


def test_redis_killed_and_restarted_under_load(cluster: Cluster) -> None:
    c = cluster
    pids = {name: proc.pid for name, proc in _processes(c).items() if proc.poll() is None}
    load = start_load(c)

    def outage() -> None:
        time.sleep(2)  # the fault: Redis gone for 2 s (a supervisor's restart delay)
        c.restart_redis()

    c.kill_redis()
    probes = probe_during(c, load.polled[0], outage)
    problems = probe_problems(probes) + recovered(c, pids, load) + serves_again(c)
    assert not problems, report("Redis SIGKILL + restart", probes, problems, c)
    report("Redis SIGKILL + restart", probes, problems, c)


def test_redis_paused_longer_than_a_request_timeout(cluster: Cluster) -> None:
    c = cluster
    pids = {name: proc.pid for name, proc in _processes(c).items() if proc.poll() is None}
    load = start_load(c)

    def outage() -> None:
        time.sleep(PAUSE_S)  # the fault: Redis stopped, its connections open and silent
        c.resume_redis()

    c.pause_redis()
    probes = probe_during(c, load.polled[0], outage)
    problems = probe_problems(probes) + recovered(c, pids, load) + serves_again(c)
    assert not problems, report("Redis SIGSTOP + SIGCONT", probes, problems, c)
    report("Redis SIGSTOP + SIGCONT", probes, problems, c)



def test_redis_full_under_load(cluster: Cluster) -> None:
    """Valkey at `maxmemory` (noeviction): every write refused with OOM for FULL_S. Workers wait it
    out (it is a transient error: conveyor/jobqueue/redis_errors.py) and keep their jobs; no event is
    counted unwritten; submits answer 503; /ready says the api cannot take requests meanwhile."""
    c = cluster
    pids = {name: proc.pid for name, proc in _processes(c).items() if proc.poll() is None}
    load = start_load(c)
    with c.redis() as r:
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", max(1, int(r.info("memory")["used_memory"]) // 2))

    def outage() -> None:
        time.sleep(FULL_S)  # the fault: Redis full, refusing every write
        with c.redis() as r:
            r.config_set("maxmemory", 0)

    probes = probe_during(c, load.polled[0], outage)
    problems = probe_problems(probes) + recovered(c, pids, load) + serves_again(c)
    ready = next(p for p in probes if p.what == "GET /ready")
    if ready.status != 503 and ready.seconds < FULL_S:
        problems.append(f"/ready answered {ready.status} while Redis refused every write")
    assert not problems, report("Redis at maxmemory", probes, problems, c)
    report("Redis at maxmemory", probes, problems, c)
