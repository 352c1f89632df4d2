"""Processes that die under live clients, end to end: an engine worker (SIGKILL, SIGTERM) under a sync
stream (/generate_stream) and an async one (/v1/jobs/{id}/events); an api (SIGKILL) whose clients
resume on another api with Last-Event-ID; a poison job that kills every worker it meets.

The promise each time: every client sees every index once, in order, to the final event, and the
text is the one an uninterrupted run gives. (tests/worker has the same faults without an api.)"""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest

from conveyor.wire.job import RecordField
from conveyor.worker.faults import CRASH_EXIT_CODE, CRASH_ON_TOKEN_ENV
from tests.api.conftest import until
from tests.faults.clients import Followed, events_url, follow, headers, result_text, submit, text_of
from tests.faults.conftest import Cluster, sim_workers

pytestmark = [pytest.mark.faults, pytest.mark.slow]

WORKERS = 3
BATCH = 3  # max_batch_size: a worker that holds this many takes no more, so a victim gets a job for sure
POISON = 48999  # a token no prompt of this module holds: a job whose prompt has it kills its worker
MAX_ATTEMPTS = 2
N = 800  # tokens per job: long enough to be mid-stream when the fault comes, short on the tiny model
SYNC = {"inputs": "Count forever", "parameters": {"max_new_tokens": N}}
ASYNC = {"prompt": "Once upon a time", "max_tokens": N, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module", params=["model", "sim"])
def cluster(request, cluster_factory) -> Cluster:  # type: ignore[no-untyped-def]
    # "sim": the same faults on the simulated engine, 5 ms steps: a job's tokens of several steps go
    # out as one entry, and a resume continues from such entries
    engine = sim_workers(5) if request.param == "sim" else {}
    return cluster_factory(WORKERS, worker_env={
        CRASH_ON_TOKEN_ENV: str(POISON), "CONVEYOR_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
        "CONVEYOR_DRAIN_TIMEOUT": "1",  # SIGTERM: 1 s to drain, then the rest is handed over
        "CONVEYOR_MAX_BATCH_SIZE": str(BATCH), **engine,
    })


@pytest.fixture
def healthy(cluster: Cluster) -> Cluster:
    cluster.top_up(WORKERS)
    return cluster


def running_on(cluster: Cluster, job_id: str) -> str:
    """The worker a job runs on, once it runs."""
    return until(lambda: cluster.record(job_id).get(RecordField.WORKER), f"job {job_id} started")


def reference(cluster: Cluster) -> tuple[str, str]:
    """The texts of uninterrupted runs of SYNC and ASYNC (greedy: the same alone or in any batch)."""
    sync = httpx.post(cluster.url + "/generate", json=SYNC, headers=headers(), timeout=120)
    completion = httpx.post(cluster.url + "/v1/completions", json=ASYNC, headers=headers(), timeout=120)
    assert sync.status_code == 200 and completion.status_code == 200, (sync.text, completion.text)
    return sync.json()["generated_text"], completion.json()["choices"][0]["text"]


def check_complete(cluster: Cluster, seen: Followed, job_id: str, expected_text: str) -> None:
    assert seen.problems() == [] and seen.end == "final", (seen.problems(), seen.end)
    assert seen.indices() == list(range(N)), "the model stopped at EOS: pick another prompt"
    record = cluster.record(job_id)
    assert record[RecordField.STATUS] == "succeeded", record
    assert text_of(seen) == result_text(record) == expected_text


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_worker_dies_under_a_sync_and_an_async_stream(healthy: Cluster, sig: signal.Signals) -> None:
    c = healthy
    pool = ThreadPoolExecutor(8)
    sync = Followed()
    streams: list[tuple[Followed, Future[Followed]]] = [
        (sync, pool.submit(follow, "POST", c.url + "/generate_stream", json_body=SYNC, into=sync))]
    until(lambda: sync.job_id and sync.events, "the sync stream's first token")
    victim = running_on(c, sync.job_id)  # type: ignore[arg-type]
    # Async jobs until one runs on the victim too (the others run on the survivors: controls). Which
    # worker reads a job is a race, but workers pull by capacity: the survivors read nothing once they
    # hold BATCH each, so one of these runs on the victim.
    async_ids = []
    for _ in range((WORKERS - 1) * BATCH + 1):
        r = submit(c.url, ASYNC)
        assert r.status_code == 202, r.text
        async_ids.append(r.json()["id"])
        seen = Followed()
        streams.append((seen, pool.submit(follow, "GET", events_url(c.url, async_ids[-1]), into=seen)))
        if running_on(c, async_ids[-1]) == victim:
            break
    assert running_on(c, async_ids[-1]) == victim, "no async job ran on the victim"
    until(lambda: all(len(s.events) >= 10 for s, _f in streams), "every client mid-stream")
    assert all(len(s.events) < N for s, _f in streams), "a job finished before the fault: make N larger"

    c.fleet.signal(victim, sig)
    assert c.fleet.procs[victim].wait(60) == (-signal.SIGKILL if sig == signal.SIGKILL else 0), c.logs()
    exited_at = time.time()
    results = [(s, f.result(timeout=300)) for s, f in streams]
    pool.shutdown()

    sync_text, async_text = reference(c)
    check_complete(c, results[0][1], sync.job_id, sync_text)  # type: ignore[arg-type]
    for job_id, (_s, seen) in zip(async_ids, results[1:], strict=True):
        check_complete(c, seen, job_id, async_text)
    victims = [sync.job_id, async_ids[-1]]
    moved = [j for j in victims if c.record(j)[RecordField.WORKER] != victim]  # type: ignore[index]
    # SIGTERM drains for 1 s: a job that ends within it ends on the victim (on a loaded machine the
    # sync job, started first, can be that close to its end); the rest must move.
    for job_id in set(victims) - set(moved):
        record = c.record(job_id)  # type: ignore[arg-type]
        assert sig == signal.SIGTERM and float(record[RecordField.FINISHED_AT]) <= exited_at, \
            f"job {job_id} of the victim was neither resumed elsewhere nor finished in its drain"
    assert moved, "the victim's jobs were not resumed elsewhere"
    if sig == signal.SIGKILL:
        assert [c.record(j)[RecordField.ATTEMPTS] for j in moved] == ["2", "2"]  # type: ignore[arg-type]


def test_an_api_dies_and_its_clients_resume_on_another_with_last_event_id(healthy: Cluster) -> None:
    c = healthy
    doomed = c.start_api()
    job_id = submit(doomed.base_url, ASYNC).json()["id"]
    pool = ThreadPoolExecutor(2)
    async_seen, sync_seen = Followed(), Followed()
    base = doomed.base_url
    futures = [pool.submit(follow, "GET", events_url(base, job_id), into=async_seen),
               pool.submit(follow, "POST", base + "/generate_stream", json_body=SYNC, into=sync_seen)]
    until(lambda: len(async_seen.events) >= 20 and len(sync_seen.events) >= 20, "both clients mid-stream")

    doomed.processes["api"].send_signal(signal.SIGKILL)
    assert doomed.processes["api"].wait(30) == -signal.SIGKILL
    cut = [f.result(timeout=120) for f in futures]
    pool.shutdown()
    assert all(s.end.startswith(("exception", "closed")) for s in cut), [s.end for s in cut]

    for before, resumed_id in [(cut[0], job_id), (cut[1], sync_seen.job_id)]:
        last = before.indices()[-1]
        assert before.indices() == list(range(last + 1))
        rest = follow("GET", events_url(c.url, resumed_id), extra_headers={"Last-Event-ID": str(last)})
        assert rest.problems(start=last + 1) == [] and rest.end == "final", rest.problems(start=last + 1)
        indices = before.indices() + rest.indices()
        assert indices == list(range(len(indices))), "a gap or a duplicate across the two apis"
        record = c.wait_terminal(resumed_id)  # type: ignore[arg-type]
        if record[RecordField.STATUS] == "succeeded":  # the api died: nobody cancelled the jobs
            assert len(indices) == N
            assert text_of(before) + text_of(rest) == result_text(record)
    assert c.record(job_id)[RecordField.STATUS] == "succeeded"


def test_a_poison_job_is_dead_lettered_and_the_others_are_unaffected(healthy: Cluster) -> None:
    c = healthy
    alive = set(c.live_workers())
    poison_id = submit(c.url, {"prompt": [5, POISON, 7], "max_tokens": 20}).json()["id"]
    pool = ThreadPoolExecutor(8)
    poison_stream = pool.submit(follow, "GET", events_url(c.url, poison_id))

    def dead() -> list[str]:
        return [w for w in alive if c.fleet.procs[w].poll() is not None]

    until(lambda: dead(), "the poison job's first worker died")
    # The others start after the first death, so none shared the poison's first worker; some run on
    # the worker its second delivery kills and are resumed by the last one (their second attempt).
    sync_streams = [pool.submit(follow, "POST", c.url + "/generate_stream", json_body=SYNC) for _ in range(2)]
    async_ids = [submit(c.url, ASYNC).json()["id"] for _ in range(2)]
    async_streams = [pool.submit(follow, "GET", events_url(c.url, i)) for i in async_ids]

    poisoned = poison_stream.result(timeout=300)
    record = c.wait_terminal(poison_id)
    assert record[RecordField.STATUS] == "failed", record
    error = json.loads(record[RecordField.RESULT]).get("error") or ""
    assert f"max_attempts={MAX_ATTEMPTS}" in error and "dead-letter stream" in error, error
    assert poisoned.end == "final" and poisoned.events[-1][1]["result"]["status"] == "failed", poisoned
    with c.redis() as r:
        dead_letters = [f for _id, f in r.xrange(c.keys.dead_letter_stream)]  # type: ignore[union-attr]
    assert [(f["id"], f["deliveries"]) for f in dead_letters] == [(poison_id, str(MAX_ATTEMPTS + 1))]
    assert sorted(c.fleet.procs[w].poll() for w in dead()) == [CRASH_EXIT_CODE] * MAX_ATTEMPTS, c.logs()

    sync_text, async_text = reference(c)
    for future in sync_streams:
        seen = future.result(timeout=300)
        check_complete(c, seen, seen.job_id, sync_text)  # type: ignore[arg-type]
    for job_id, future in zip(async_ids, async_streams, strict=True):
        check_complete(c, future.result(timeout=300), job_id, async_text)
    pool.shutdown()
    with c.redis() as r:
        assert sum(r.xpending(s, "workers")["pending"] for s in c.keys.jobs_streams) == 0  # type: ignore[index]
