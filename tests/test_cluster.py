"""The integration suite on a real Redis Cluster: a representative set of the api, worker, relay,
failover and cancel tests runs again with CONVEYOR_TEST_REDIS=cluster, under which tests/conftest.py
starts a 3-node cluster on loopback (conveyor/launcher/redis_cluster.py) instead of one server, and every
process and client of those tests talks to it through redis-py's RedisCluster. A run of its own (a
pytest process) so its session fixtures, the servers and services, are the cluster's; `make
test-cluster` runs the same modules directly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import CLUSTER, REPO

CLUSTER_MODULES = (
    "tests/api/test_async_jobs.py",  # submit, poll, cancel, list through the api and a worker process
    "tests/api/test_relay.py",  # live events on sharded pub/sub, backlog, resume
    "tests/worker/test_cancel.py",  # cancel through the control channel to a worker process
    "tests/jobqueue/test_depth.py",  # the queue's depth: one script per shard over bands and own streams
    # SIGKILL of a worker mid-generation: resumed by another from its events, no gap, no duplicate
    "tests/worker/test_failover.py::test_sigkill_mid_generation_resumes_on_another_worker",
    # prefix affinity: the api's enqueue script, the READ script's stealing, the own stream's doorbell
    "tests/worker/test_affinity.py::test_a_job_placed_on_a_stopped_worker_is_taken_by_another_within_the_wait",
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow,
              pytest.mark.skipif(CLUSTER, reason="this is the cluster run's launcher")]


def test_the_integration_suite_passes_on_a_three_node_cluster() -> None:
    env = {**os.environ, "CONVEYOR_TEST_REDIS": "cluster"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CLUSTER_MODULES],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
