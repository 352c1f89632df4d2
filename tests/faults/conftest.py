"""The fault suite (`pytest -m faults`, `make test-faults`): real valkey-server, api and worker
processes on loopback, on the tiny random Llama, with faults an operator meets — processes killed,
Redis killed or paused, poison jobs, hostile input, a long mixed soak.

Each module runs its own `Cluster`: a valkey-server of its own (so a test may kill or pause it;
AOF fsynced on every write, so a restart loses nothing that was acknowledged) or a Redis Cluster of
its own on loopback (`replicas=`: 3 primaries with that many replicas each), engine workers with
known ids (`tests.worker.conftest.Fleet`) and one or more apis (`tests.conftest.start_service`),
all under one key prefix. Fault tests that live with the code they check (JOINED: issue 11's
items, the worker fleet's kills) get the `faults` marker here instead of being written twice; the
hook acts whenever this directory is collected, as `pytest -m faults` from the root does.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from conveyor.jobqueue.client import make_sync_client
from conveyor.jobqueue.keys import Keys
from conveyor.launcher.redis_cluster import LocalCluster
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.settings import Settings
from conveyor.wire.event_batch import events_after
from conveyor.wire.heartbeat import WorkerInfo
from conveyor.wire.job import JobEvent, RecordField
from tests.api.conftest import KEYS, TERMINAL, until
from tests.conftest import RunningService, start_service, stop_service
from tests.readiness import wait_until
from tests.worker.conftest import Fleet, new_fleet

# Fault tests that live with the code they test; `-m faults` runs them as part of this suite
# (test_joined.py checks that each still exists). Issue 11's items, then the worker's own faults.
JOINED = (
    "tests/api/test_admission.py",  # 1. caps hold under a burst; a full pool waits, never a 500
    "tests/api/test_redis_down.py",  # 2. Redis down: 503 + Retry-After
    "tests/api/test_relay_faults.py",  # 3. the relay after a Redis restart or pause
    "tests/worker/test_redis_outage.py",  # 4. an outage shorter than the lease moves no job
    "tests/api/test_log_secrets.py",  # 5. no secret in a log line, label, /info or the document
    "tests/api/test_resume.py",  # 6. Last-Event-ID past the end
    "tests/api/test_lone_surrogates.py",  # 7. lone surrogates: 422, never 500
    "tests/worker/test_failover.py",  # worker SIGKILL mid-generation, poison job, no false takeover
    "tests/worker/test_fleet.py::test_sigterm_under_load_loses_nothing",
    "tests/worker/test_fleet.py::test_a_second_signal_exits_at_once_and_leaves_the_job_pending",
)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.nodeid == joined or item.nodeid.startswith(joined + "::") for joined in JOINED):
            item.add_marker(pytest.mark.faults)


@dataclass
class Cluster:
    """One deployment on loopback: its own Redis (one server, or a cluster), workers `fleet.procs`
    (by worker id), apis."""

    redis_server: EmbeddedRedis | LocalCluster
    fleet: Fleet
    api_env: dict[str, str]
    log_dir: Path
    apis: list[RunningService] = field(default_factory=list)
    _next_worker: int = 0

    @property
    def keys(self) -> Keys:
        return self.fleet.keys

    @property
    def url(self) -> str:
        """The first api's base URL."""
        return self.apis[0].base_url

    def redis(self) -> Redis:
        """A blocking client (RedisCluster on a cluster: each command routed by its key)."""
        return make_sync_client(Settings(redis_url=self.redis_server.url), decode_responses=True,
                                socket_timeout=10)

    # --- workers

    def start_workers(self, n: int, **env: str) -> list[str]:
        """n more workers with fresh ids; returns once each one's heartbeat is live."""
        ids = [f"w{self._next_worker + i}" for i in range(n)]
        self._next_worker += n
        self.fleet.start(*ids, **env)
        starting = {worker_id: self.fleet.procs[worker_id] for worker_id in ids}
        wait_until(lambda: self._heartbeats(ids), f"the heartbeats of {', '.join(ids)}", starting, self.logs)
        return ids

    def _heartbeats(self, worker_ids: list[str]) -> bool:
        with self.redis() as r:
            return r.exists(*(self.keys.worker(w) for w in worker_ids)) == len(worker_ids)

    def live_workers(self) -> list[str]:
        return [w for w, p in self.fleet.procs.items() if p.poll() is None]

    def top_up(self, n: int) -> None:
        """Back to n live workers (a test before may have killed some)."""
        missing = n - len(self.live_workers())
        if missing > 0:
            self.start_workers(missing)

    def worker_info(self) -> dict[str, WorkerInfo]:
        with self.redis() as r:
            raw = {key: r.get(key) for key in r.scan_iter(match=self.keys.workers_pattern)}
        return {info.id: info for info in (WorkerInfo.model_validate_json(v) for v in raw.values() if v)}

    def blocks_used(self) -> int:
        """KV blocks held by sequences on every live worker, from their heartbeats (engine load)."""
        return sum(info.load.blocks_used for info in self.worker_info().values())

    # --- apis

    def start_api(self, webhook_workers: int = 0, **env: str) -> RunningService:
        """One more api (and `webhook_workers` webhook processes) on this cluster's Redis and prefix."""
        api_dir = self.log_dir / f"api{len(self.apis)}"
        api_dir.mkdir()
        api = start_service(api_dir, self.redis_server.url, {**self.api_env, **env}, workers=0,
                            webhook_workers=webhook_workers)
        self.apis.append(api)
        return api

    # --- Redis

    @property
    def server(self) -> EmbeddedRedis:
        """The one server (the tests of a single Redis)."""
        assert isinstance(self.redis_server, EmbeddedRedis)
        return self.redis_server

    def kill_redis(self) -> None:
        process = self.server.process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def restart_redis(self) -> None:
        """The same port and AOF directory, as an operator's supervisor would restart it."""
        self.redis_server = EmbeddedRedis(self.server.data_dir, port=self.server.port,
                                          appendfsync=self.server.appendfsync).start()

    def pause_redis(self) -> None:
        assert self.server.process is not None
        os.kill(self.server.process.pid, signal.SIGSTOP)

    def resume_redis(self) -> None:
        assert self.server.process is not None
        os.kill(self.server.process.pid, signal.SIGCONT)

    # --- jobs

    def record(self, job_id: str) -> dict[str, str]:
        with self.redis() as r:
            return r.hgetall(self.keys.job(job_id))  # type: ignore[return-value]

    def events(self, job_id: str) -> list[JobEvent]:
        """The job's durable event stream, as a client resuming from index -1 would get it."""
        with self.redis() as r:
            entries = r.xrange(self.keys.events(job_id))
        return events_after(entries, -1)  # type: ignore[union-attr]

    def wait_terminal(self, job_id: str, timeout: float = 180) -> dict[str, str]:
        return until(lambda: (r := self.record(job_id)).get(RecordField.STATUS) in TERMINAL and r,
                     f"job {job_id} terminal", timeout)

    def logs(self) -> str:
        parts = [self.fleet.logs(), *(api.logs() for api in self.apis)]
        server = self.redis_server
        servers = server.nodes if isinstance(server, LocalCluster) else [server]
        for server in servers:
            server_log = server.data_dir / "server.log"
            if server_log.exists():
                parts.append(f"--- valkey :{server.port}\n{server_log.read_text()[-2000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        server = self.redis_server
        if isinstance(server, EmbeddedRedis) and server.process is not None and server.process.poll() is None:
            self.resume_redis()  # a paused server cannot answer the processes' goodbyes
        for api in self.apis:
            stop_service(api)
        self.fleet.stop()
        self.redis_server.stop()


def sim_workers(step_ms: float) -> dict[str, str]:
    """Worker settings of the simulated engine (docs/operations/simulated-engine.md) on the tiny model's
    tokenizer: every step `step_ms`, a GPU's token rate, so the stream interval coalesces steps."""
    return {"CONVEYOR_ENGINE": "sim", "CONVEYOR_SIM_STEP_FIXED_MS": str(step_ms),
            "CONVEYOR_SIM_WEIGHT_GB": "0", "CONVEYOR_SIM_PREFILL_GFLOP_PER_TOKEN": "0",
            "CONVEYOR_SIM_KV_BYTES_PER_TOKEN": "512"}


def start_cluster(log_dir: Path, model_dir: Path, workers: int, worker_env: dict[str, str] | None = None,
                  api_env: dict[str, str] | None = None, webhook_workers: int = 0,
                  replicas: int | None = None) -> Cluster:
    """`replicas`: None, one valkey-server; else a Redis Cluster of 3 primaries with that many
    replicas each."""
    server: EmbeddedRedis | LocalCluster
    if replicas is None:
        server = EmbeddedRedis(log_dir / "redis", appendfsync="always").start()
    else:
        server = LocalCluster(log_dir / "redis", nodes=3, replicas=replicas, appendfsync="always").start()
    # Fleet's async client is not used: this suite talks to Redis synchronously (Cluster.redis).
    fleet = new_fleet(None, server.url, model_dir, log_dir)  # type: ignore[arg-type]
    fleet.env.update(worker_env or {})
    keys_file = log_dir / "api-keys.json"
    keys_file.write_text(json.dumps(KEYS))
    cluster = Cluster(server, fleet, {
        "CONVEYOR_MODEL": str(model_dir), "CONVEYOR_KEY_PREFIX": fleet.keys.prefix,
        "CONVEYOR_API_KEYS_FILE": str(keys_file), "CONVEYOR_LOG_FORMAT": "json", "OMP_NUM_THREADS": "1",
        **(api_env or {}),
    }, log_dir)
    try:
        cluster.start_api(webhook_workers)
        if workers:
            cluster.start_workers(workers)
            cluster.apis[0].wait_ready(workers)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module")
def cluster_factory(tmp_path_factory: pytest.TempPathFactory,
                    tiny_model_dir: Path) -> Iterator[Callable[..., Cluster]]:
    """Starts the module's cluster(s) (arguments: `start_cluster`'s); stops them when it is done."""
    started: list[Cluster] = []

    def make(workers: int = 2, **options: Any) -> Cluster:
        cluster = start_cluster(tmp_path_factory.mktemp("faults"), tiny_model_dir, workers, **options)
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()
