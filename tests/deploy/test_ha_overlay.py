"""The high-availability overlay (deploy/k8s/overlays/ha): a Valkey cluster of 3 primaries + 3
replicas with a password and TLS, which Conveyor's pods reach by REDIS_URL. Its manifests are valid,
they agree with each other and with Conveyor's settings, and the start script's config is one the
real Valkey 8.1 accepts (its TLS lines aside: the test build has no TLS; tests/e2e/test_redis_tls.py
runs the clients over TLS) after rewriting the peers' IPs of nodes.conf from their names."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import redis

from conveyor.launcher.redis_cluster import cluster_port
from conveyor.launcher.redis_server import server_binary
from conveyor.settings import ENV_PREFIX, Settings
from tests.deploy.kustomize import Doc, find
from tests.deploy.pods import conveyor_containers, env_of
from tests.deploy.test_manifests import rendered, validate

CLUSTER = "conveyor-redis-cluster"
PASSWORD = "s3cret"


def docs() -> list[Doc]:
    return rendered("ha")


def test_every_manifest_is_valid() -> None:
    built = docs()
    for doc in built:
        validate(doc)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in built}
    assert {("StatefulSet", CLUSTER), ("Service", CLUSTER), ("PodDisruptionBudget", CLUSTER),
            ("Job", CLUSTER + "-create"), ("NetworkPolicy", CLUSTER), ("ConfigMap", CLUSTER)} <= kinds


def test_conveyor_reaches_every_node_over_tls_with_one_shard_per_primary() -> None:
    built = docs()
    nodes = find(built, "StatefulSet", CLUSTER)["spec"]["replicas"]
    create = find(built, "ConfigMap", CLUSTER)["data"]["create.sh"]
    replicas_per_primary = int(create.split("--cluster-replicas")[1].split()[0])
    assert f"for i in {' '.join(map(str, range(nodes)))}; do" in create
    primaries = nodes // (1 + replicas_per_primary)
    settings = find(built, "ConfigMap", "conveyor-settings")["data"]
    assert (settings["CONVEYOR_REDIS_CLUSTER"], int(settings["CONVEYOR_JOBS_SHARDS"])) == ("true", primaries)
    expected_hosts = {f"{CLUSTER}-{i}.{CLUSTER}:6379" for i in range(nodes)}
    for container in conveyor_containers(built):
        env = {e["name"]: e.get("value") for e in env_of(container)}
        url = urlsplit(env["REDIS_URL"])
        assert url.scheme == "rediss"
        assert set(url.netloc.split("@")[1].split(",")) == expected_hosts
        [ca] = parse_qs(url.query)["ssl_ca_certs"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts[str(Path(ca).parent)] == "redis-tls"
        # webhooks: RQ does not run on a cluster, so a plain Valkey of their own
        assert urlsplit(env[ENV_PREFIX + "WEBHOOK_REDIS_URL"]).hostname == "conveyor-redis"
        Settings(redis_url=env["REDIS_URL"].replace("$(REDIS_PASSWORD)", PASSWORD), redis_cluster=True)
    for workload in ("conveyor-api", "conveyor-worker", "conveyor-webhooks"):
        volumes = find(built, "Deployment", workload)["spec"]["template"]["spec"]["volumes"]
        tls = next(v for v in volumes if v["name"] == "redis-tls")
        assert tls["secret"]["secretName"] == "conveyor-redis-tls"
        assert [i["key"] for i in tls["secret"]["items"]] == ["ca.crt"]


def run_start_script(tmp_path: Path, nodes_conf: str) -> tuple[str, str]:
    """start.sh with /data in tmp_path, `getent` answering 10.0.0.<N> for pod N's name, and a
    `valkey-server` that writes the config it is given: (the config, nodes.conf afterwards)."""
    script = find(docs(), "ConfigMap", CLUSTER)["data"]["start.sh"].replace("/data", str(tmp_path))
    (tmp_path / "nodes.conf").write_text(nodes_conf)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "getent").write_text('#!/bin/sh\nn=${2#conveyor-redis-cluster-}\necho "10.0.0.${n%%.*} $2"\n')
    (fake / "valkey-server").write_text(f'#!/bin/sh\ncat > {tmp_path}/valkey.conf\n')
    for path in fake.iterdir():
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "POD_NAME": f"{CLUSTER}-0",
           "REDIS_PASSWORD": PASSWORD}
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=30)
    return (tmp_path / "valkey.conf").read_text(), (tmp_path / "nodes.conf").read_text()


def test_the_start_script_updates_peer_ips_and_valkey_takes_its_config(tmp_path: Path) -> None:
    conf = (f"aaa1 10.9.9.1:6379@16379,{CLUSTER}-1.{CLUSTER} master - 0 0 1 connected 0-5460\n"
            f"bbb2 10.9.9.2:6379@16379,{CLUSTER}-2.{CLUSTER} myself,master - 0 0 2 connected 5461-16383\n"
            "vars currentEpoch 2 lastVoteEpoch 0\n")
    config, nodes_conf = run_start_script(tmp_path, conf)
    assert nodes_conf.splitlines()[:2] == [
        f"aaa1 10.0.0.1:6379@16379,{CLUSTER}-1.{CLUSTER} master - 0 0 1 connected 0-5460",
        f"bbb2 10.0.0.2:6379@16379,{CLUSTER}-2.{CLUSTER} myself,master - 0 0 2 connected 5461-16383"]
    lines = config.splitlines()
    assert {"port 0", "tls-port 6379", "tls-replication yes", "tls-cluster yes", f"requirepass {PASSWORD}",
            f"masterauth {PASSWORD}", f"cluster-announce-hostname {CLUSTER}-0.{CLUSTER}",
            "maxmemory-policy noeviction", "hash-max-listpack-value 4096"} <= set(lines)
    # The real server takes the rest (a plain port instead of TLS, files in tmp_path).
    port = cluster_port()
    plain = [line for line in lines if not line.startswith(("tls-", "port ", "dir ", "cluster-config-file"))]
    (tmp_path / "node").mkdir()
    plain += [f"port {port}", f"dir {tmp_path / 'node'}", "cluster-config-file nodes.conf"]
    (tmp_path / "plain.conf").write_text("\n".join(plain) + "\n")
    server = subprocess.Popen([str(server_binary()), str(tmp_path / "plain.conf")], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        client = redis.Redis(port=port, password=PASSWORD, decode_responses=True)
        deadline = time.monotonic() + 60
        while server.poll() is None and time.monotonic() < deadline:  # until it answers, or exits
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        assert server.poll() is None, server.stdout.read().decode() if server.stdout else ""
        assert client.config_get("cluster-announce-hostname") == {
            "cluster-announce-hostname": f"{CLUSTER}-0.{CLUSTER}"}
        assert client.info("cluster")["cluster_enabled"] == 1
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert client.config_get("hash-max-listpack-value")["hash-max-listpack-value"] == "4096"
        client.close()
    finally:
        server.terminate()
        server.wait(10)
