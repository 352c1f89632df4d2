"""Redis over TLS (`rediss://`), as the HA deployment runs it (deploy/k8s/overlays/ha): the api and a
worker reach one Valkey, and a 3-node cluster, only through TLS fronts (tests/tls_proxy.py) whose
certificate they verify against the CA named in REDIS_URL (`ssl_ca_certs`), and serve jobs there.
Without the CA the certificate is refused: verification is on, not just encryption."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from conveyor.jobqueue.client import make_sync_client
from conveyor.launcher.redis_cluster import BUS_OFFSET, LocalCluster
from conveyor.launcher.redis_server import EmbeddedRedis, free_port
from conveyor.settings import Settings
from tests.conftest import start_service, stop_service
from tests.tls_proxy import TestCA, TLSProxy

pytestmark = pytest.mark.slow

JOB = {"inputs": "Say hi", "parameters": {"max_new_tokens": 4, "details": True}}


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA.create(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def tls_valkey(tmp_path_factory: pytest.TempPathFactory, ca: TestCA) -> Iterator[TLSProxy]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("tls-valkey")).start()
    proxy = TLSProxy(server.port, ca.server_context).start()
    yield proxy
    proxy.close()
    server.stop()


def tls_url(ports: list[int], ca: TestCA) -> str:
    hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
    return f"rediss://{hosts}/0?ssl_ca_certs={ca.ca_file}"


def serves_a_job(tmp: Path, url: str, model: Path, proxies: list[TLSProxy]) -> None:
    before = sum(p.handshakes for p in proxies)
    service = start_service(tmp, url, {"CONVEYOR_MODEL": str(model), "CONVEYOR_KV_CACHE_MEMORY": "16MiB"})
    try:
        answer = httpx.post(service.base_url + "/generate", json=JOB, timeout=120)
        assert answer.status_code == 200, answer.text + service.logs()
        assert answer.json()["details"]["generated_tokens"] == 4
        ready = httpx.get(service.base_url + "/ready", timeout=10)
        assert ready.status_code == 200 and ready.json()["workers"] == 1, ready.text
    finally:
        stop_service(service)
    # the api (its pool and its relay) and the worker each opened TLS sessions
    assert sum(p.handshakes for p in proxies) - before >= 3


def test_a_client_verifies_the_servers_certificate(tls_valkey: TLSProxy, ca: TestCA) -> None:
    with make_sync_client(Settings(redis_url=tls_url([tls_valkey.port], ca), redis_cluster=False)) as client:
        assert client.ping()
    unverified = f"rediss://127.0.0.1:{tls_valkey.port}/0"  # the system's CAs: ours is not one of them
    with make_sync_client(Settings(redis_url=unverified, redis_cluster=False)) as client, \
            pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        client.ping()


def test_the_service_runs_on_one_valkey_over_tls(tmp_path: Path, tls_valkey: TLSProxy, ca: TestCA,
                                                 tiny_model_dir: Path) -> None:
    serves_a_job(tmp_path, tls_url([tls_valkey.port], ca), tiny_model_dir, [tls_valkey])


def test_the_service_runs_on_a_cluster_over_tls(tmp_path: Path, ca: TestCA, tiny_model_dir: Path) -> None:
    """Each node announces its TLS front's port (CLUSTER SLOTS, MOVED), as a TLS-only node announces
    its tls-port: every connection the clients open, to any node, goes through TLS."""
    cluster = LocalCluster(tmp_path / "cluster")
    proxies = []
    for node in cluster.nodes:
        front = free_port()
        node.extra_args += ("--cluster-announce-port", str(front),
                            "--cluster-announce-bus-port", str(node.port + BUS_OFFSET))
        proxies.append(TLSProxy(node.port, ca.server_context, port=front))
    cluster.start()
    try:
        for proxy in proxies:
            proxy.start()
        (tmp_path / "service").mkdir()
        serves_a_job(tmp_path / "service", tls_url([p.port for p in proxies], ca), tiny_model_dir, proxies)
    finally:
        for proxy in proxies:
            proxy.close()
        cluster.stop()
