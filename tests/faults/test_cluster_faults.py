"""Redis Cluster fails under load: (a) a primary with no replica SIGKILLed and restarted on its port
from its AOF; (b) 3 primaries + 3 replicas, a manual `CLUSTER FAILOVER`; (c) 3 + 3, a primary
SIGKILLed and its replica promoted (the dead node stays dead until the checks are done). The api and
the workers take the cluster's URL and are not restarted. The promises, as for one Redis
(test_redis_faults.py, whose load and checks these reuse): no process exits, no job lost or stuck,
no gap or duplicate in any stream, every stream ends at most STREAM_END_S after its job, and
complete (each fault is over well inside the relay's outage timeout: an error event would be a
stream the relay failed to resume), no job record left without its queue entry, `/ready` true to what the
api can do in every phase, and the same processes serve again afterwards.

The faulted primary is the one serving the live channel of the api process that follows the first
followed job (Keys.live), so streams have to move with its slot."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from conveyor.launcher.redis_cluster import LocalCluster
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.wire.job import RecordField
from tests.api.conftest import TERMINAL
from tests.faults.clients import submit
from tests.faults.conftest import Cluster
from tests.faults.test_redis_faults import (
    Load,
    _processes,
    probe_during,
    probe_problems,
    recovered,
    report,
    serves_again,
    start_load,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow]

# A failover (3 s node timeout, then an election) fits well inside the lease: workers keep their jobs.
WORKER_ENV = {"CONVEYOR_JOB_LEASE_MS": "10000", "CONVEYOR_HEARTBEAT_INTERVAL_MS": "1000"}
RESTART_DELAY_S = 2  # a supervisor's restart delay
STREAM_END_S = 45  # a stream ends this long after its job at most (the relay's outage timeout is 30 s)
TINY = {"prompt": "ok", "max_tokens": 1, "temperature": 0}


@pytest.fixture(scope="module")
def no_replica(cluster_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return cluster_factory(2, replicas=0, worker_env=WORKER_ENV)


@pytest.fixture(scope="module")
def replicated(cluster_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return cluster_factory(2, replicas=1, worker_env=WORKER_ENV)


def nodes(c: Cluster) -> LocalCluster:
    assert isinstance(c.redis_server, LocalCluster)
    return c.redis_server


@dataclass
class ReadyWatch:
    """/ready asked every half second through the fault, each 200 checked at once by a submit:
    a 503 to the submit while /ready said 200 before and after it is a readiness that lies."""

    c: Cluster
    answers: list[tuple[float, int | None]] = field(default_factory=list)  # (since start, /ready)
    lies: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)  # the submits' jobs, checked like the load's
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        started = time.monotonic()
        suspect: str | None = None
        while not self._stop.wait(0.5):
            status = self._ready()
            self.answers.append((round(time.monotonic() - started, 1), status))
            if status != 200:
                suspect = None
                continue
            if suspect is not None:
                self.lies.append(suspect)
            suspect = self._submit()

    def stop(self) -> None:
        self._stop.set()

    def steady(self, answers: int = 6, timeout: float = 60) -> None:
        """Stops once the last `answers` were all 200 (or after `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (
                len(self.answers) >= answers and all(s == 200 for _t, s in self.answers[-answers:])):
            time.sleep(0.1)
        self.stop()

    def _ready(self) -> int | None:
        try:
            return httpx.get(self.c.url + "/ready", timeout=10).status_code
        except httpx.HTTPError:
            return None

    def _submit(self) -> str | None:
        try:
            r = submit(self.c.url, TINY)
        except httpx.HTTPError as exc:
            return f"/ready said 200, then a submit got no answer ({exc})"
        if r.status_code == 202:
            self.jobs.append(r.json()["id"])
            return None
        return f"/ready said 200, then a submit got {r.status_code} {r.text[:150]}"

    def timeline(self) -> str:
        """The phases: each run of equal answers as `status×count`."""
        runs: list[list] = []
        for _at, status in self.answers:
            if runs and runs[-1][0] == status:
                runs[-1][1] += 1
            else:
                runs.append([status, 1])
        return " ".join(f"{status}×{count}" for status, count in runs)


@pytest.fixture
def ready_watch() -> Iterator[Callable[[Cluster], ReadyWatch]]:
    """Starts a ReadyWatch on a cluster; stopped with the test, whatever its outcome."""
    watches: list[ReadyWatch] = []

    def start(c: Cluster) -> ReadyWatch:
        watches.append(ReadyWatch(c))
        threading.Thread(target=watches[-1].run, daemon=True).start()
        return watches[-1]

    yield start
    for watch in watches:
        watch.stop()


def stream_bounds(c: Cluster, load: Load, ended_at: dict[int, float]) -> list[str]:
    """Every stream ended at most STREAM_END_S after its job did (by the wall clock both share)."""
    out = []
    for dialect, seen, _future in load.streams:
        job_id = seen.job_id or load.followed_jobs.get(id(seen))
        if job_id is None or id(seen) not in ended_at:
            continue
        finished = float(c.record(job_id).get(RecordField.FINISHED_AT) or 0)
        if finished and ended_at[id(seen)] - finished > STREAM_END_S:
            out.append(f"{dialect} stream of job {job_id} ended {ended_at[id(seen)] - finished:.0f} s after "
                       f"its job (bound {STREAM_END_S} s)")
    return out


def incomplete(load: Load) -> list[str]:
    """Streams that ended with an error event: each fault here is over well inside the relay's
    outage timeout and loses no event, so every stream must resume to its end."""
    return [f"{dialect} stream of job {seen.job_id}: ended {seen.end!r} after {len(seen.events)} events, "
            "not resumed to its end"
            for dialect, seen, _future in load.streams if seen.end not in ("final", "done")]


def when_ended(load: Load) -> dict[int, float]:
    """When each stream of the load ends (epoch seconds, as the job records' times), by id(Followed)."""
    ended: dict[int, float] = {}

    def on_end(key: int) -> Callable[[object], None]:
        return lambda _future: ended.setdefault(key, time.time())  # type: ignore[func-returns-value]

    for _dialect, seen, future in load.streams:
        future.add_done_callback(on_end(id(seen)))
    return ended


def half_jobs(c: Cluster) -> list[str]:
    """Job records that will never run: not terminal, no queue entry (the load left none: checked
    by `recovered`) and no TTL (a provisional record of a refused submit expires on its own)."""
    out = []
    with c.redis() as r:
        for key in r.scan_iter(match=f"{c.keys.prefix}:job:*", _type="hash"):
            status = r.hget(key, RecordField.STATUS)
            if status not in TERMINAL and r.ttl(key) < 0:
                out.append(f"{key}: {status}, with no queue entry and no TTL")
    return out


def run_fault(c: Cluster, name: str, fault: Callable[[EmbeddedRedis], None], outage: Callable[[], None],
              ready_watch: Callable[[Cluster], ReadyWatch], down: bool) -> None:
    """The load; the fault, on the primary that serves the live channel of the first followed job's api;
    requests during it (`outage` ends it); /ready watched throughout (`down`: the cluster cannot
    serve for a while, so /ready must say so); then every check."""
    c.top_up(2)
    pids = {n: proc.pid for n, proc in _processes(c).items() if proc.poll() is None}
    load = start_load(c)
    ended_at = when_ended(load)
    watch = ready_watch(c)
    followed = c.record(next(iter(load.followed_jobs.values())))[RecordField.WATCHED]
    fault(nodes(c).owner_of(c.keys.live(followed.split()[0])))  # the api's live channel
    probes = probe_during(c, load.polled[0], outage)
    watch.steady()  # and after the fault, until the api has settled
    for job_id in watch.jobs:  # before `recovered` counts what is left in the queue
        c.wait_terminal(job_id, 120)
    problems = probe_problems(probes) + recovered(c, pids, load) + serves_again(c)
    problems += [f"readiness: {lie}" for lie in watch.lies]
    if down and all(status == 200 for _at, status in watch.answers):
        problems.append("/ready said 200 all along while the cluster could not serve")
    problems += stream_bounds(c, load, ended_at) + incomplete(load) + half_jobs(c)
    print(f"/ready through the fault, every 0.5 s: {watch.timeline()}")
    text = report(name, probes, problems, c)  # printed: what clients saw, for the docs' table
    assert not problems, text


def test_a_primary_without_replica_killed_and_restarted_under_load(
        no_replica: Cluster, ready_watch: Callable[[Cluster], ReadyWatch]) -> None:
    cluster = nodes(no_replica)
    killed: list[EmbeddedRedis] = []

    def fault(owner: EmbeddedRedis) -> None:
        killed.append(owner)
        cluster.kill(owner)

    def outage() -> None:
        time.sleep(RESTART_DELAY_S)
        cluster.restart(killed[0])
        cluster.wait_ok()

    run_fault(no_replica, "cluster primary SIGKILL + restart", fault, outage, ready_watch, down=True)


def test_a_manual_failover_under_load(replicated: Cluster,
                                      ready_watch: Callable[[Cluster], ReadyWatch]) -> None:
    cluster = nodes(replicated)
    replicas: list[EmbeddedRedis] = []

    def fault(owner: EmbeddedRedis) -> None:
        replicas.append(cluster.replica_of(owner))

    def outage() -> None:
        cluster.failover(replicas[0])  # the old primary becomes its replica
        cluster.wait_ok()

    run_fault(replicated, "cluster manual failover", fault, outage, ready_watch, down=False)


def test_a_primary_killed_and_its_replica_promoted_under_load(
        replicated: Cluster, ready_watch: Callable[[Cluster], ReadyWatch]) -> None:
    cluster = nodes(replicated)
    killed: list[EmbeddedRedis] = []

    def fault(owner: EmbeddedRedis) -> None:
        killed.append(owner)
        cluster.kill(owner)

    def outage() -> None:
        cluster.wait_ok()  # its replica promoted; the dead node stays dead through the checks

    try:
        run_fault(replicated, "cluster primary SIGKILL, replica promoted", fault, outage, ready_watch,
                  down=True)
    finally:
        if killed:  # back, as the new primary's replica, for whatever runs on this cluster next
            cluster.restart(killed[0])
            cluster.wait_ok()
            cluster.wait_in_sync()
