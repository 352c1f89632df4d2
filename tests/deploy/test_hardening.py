"""The hardening of the Kubernetes manifests (issue 39), rendered per overlay: one Secret key for the
Redis password in every consumer (the server's requirepass, valkey-cli's probe, each REDIS_URL),
Valkey with maxmemory and noeviction below its memory limit, PodDisruptionBudgets, anti-affinity and
NetworkPolicies whose selectors name pods that exist and ports those pods have."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deploy.kustomize import Doc, containers, find
from tests.deploy.pods import env_of, pod_labels, redis_url, selected, selects, workloads
from tests.deploy.test_manifests import OVERLAYS, PASSWORD_KEY, SECRET, rendered

CLIENTS = ("conveyor-api", "conveyor-worker", "conveyor-webhooks")
MIB = {"mb": 1 << 20, "gb": 1 << 30, "Mi": 1 << 20, "Gi": 1 << 30}


def secret_refs(container: Doc) -> dict[str, tuple[str, str]]:
    return {env["name"]: (ref["name"], ref["key"]) for env in env_of(container)
            if (ref := env.get("valueFrom", {}).get("secretKeyRef"))}


def only_container(docs: list[Doc], kind: str, name: str) -> Doc:
    [container] = find(docs, kind, name)["spec"]["template"]["spec"]["containers"]
    return container


def size(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([A-Za-z]+)", text).groups()  # type: ignore[union-attr]
    return int(number) * MIB[unit]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_redis_password_is_one_secret_key(overlay: str) -> None:
    docs = rendered(overlay)
    for name in CLIENTS:
        container = only_container(docs, "Deployment", name)
        assert secret_refs(container) == {"REDIS_PASSWORD": (SECRET, PASSWORD_KEY)}, name
        names = [env["name"] for env in env_of(container)]
        # $(VAR) expands only from variables defined earlier in the list.
        assert names.index("REDIS_PASSWORD") < names.index("REDIS_URL"), name
        url = redis_url(find(docs, "Deployment", name))
        assert re.fullmatch(r"redis://:\$\(REDIS_PASSWORD\)@conveyor-redis:6379/\d+", url), url
    server = only_container(docs, "StatefulSet", "conveyor-redis")
    assert secret_refs(server) == {"REDIS_PASSWORD": (SECRET, PASSWORD_KEY),
                                   "REDISCLI_AUTH": (SECRET, PASSWORD_KEY)}
    script = server["args"][0]
    assert server["command"] == ["sh", "-c"] and script.startswith("exec valkey-server - ")
    assert "\nrequirepass $REDIS_PASSWORD\n" in script  # on stdin, not in argv
    # KEDA reads the queue from the api (GET /queue), so it needs no Redis password.
    scaler = find(docs, "ScaledObject", "conveyor-worker")["spec"]
    assert not [t for t in scaler["triggers"] if "password" in str(t).lower()]
    # Nothing else reads a Redis URL or password from the Secret.
    for container in containers(docs):
        assert not {k for _, k in secret_refs(container).values()} & {"REDIS_URL"}, container["name"]


def test_valkey_never_evicts_and_stays_below_its_memory_limit() -> None:
    server = only_container(rendered("cpu"), "StatefulSet", "conveyor-redis")
    words = server["args"][0].replace("\\\n", " ").split()
    assert words[words.index("--maxmemory-policy") + 1] == "noeviction"
    maxmemory = size(words[words.index("--maxmemory") + 1])
    assert 0 < maxmemory < size(server["resources"]["limits"]["memory"])
    assert words[words.index("--appendonly") + 1] == "yes"
    assert server["readinessProbe"]["exec"]["command"][-1].endswith("| grep -qx PONG")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets_and_anti_affinity_cover_api_and_workers(overlay: str) -> None:
    docs = rendered(overlay)
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    covered = {w["metadata"]["name"] for pdb in budgets for w in selected(docs, pdb["spec"]["selector"])}
    assert covered == {"conveyor-api", "conveyor-worker"}
    for pdb in budgets:
        assert len(selected(docs, pdb["spec"]["selector"])) == 1, pdb["metadata"]["name"]
    # The worker may run one replica (or none): a minAvailable would block every node drain.
    assert find(docs, "PodDisruptionBudget", "conveyor-worker")["spec"] == {
        "maxUnavailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": "conveyor-worker"}}}
    for name in ("conveyor-api", "conveyor-worker"):
        workload = find(docs, "Deployment", name)
        [term] = workload["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert selected(docs, term["podAffinityTerm"]["labelSelector"]) == [workload]


def ports(workload: Doc) -> set[Any]:
    return {value for c in workload["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
            for value in (p["name"], p["containerPort"])}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_select_real_pods_and_ports(overlay: str) -> None:
    docs = rendered(overlay)
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    for name, spec in policies.items():
        targets = selected(docs, spec["podSelector"])
        assert targets and spec["policyTypes"] == ["Ingress"], name
        for rule in spec["ingress"]:
            for port in rule["ports"]:  # a named port must exist on every pod it opens
                assert all(port["port"] in ports(t) for t in targets), (name, port)
            for peer in rule.get("from", []):
                if "podSelector" in peer:
                    assert selected(docs, peer["podSelector"]), (name, peer)
    # Every pod of Conveyor is behind some policy (a selected pod takes only what is allowed).
    for workload in workloads(docs):
        assert any(selects(p["podSelector"], pod_labels(workload)) for p in policies.values())
    # Valkey: the three clients' pods only (KEDA asks the api), on the redis port only.
    [rule] = policies["conveyor-redis"]["ingress"]
    assert {w["metadata"]["name"] for peer in rule["from"] if "podSelector" in peer
            for w in selected(docs, peer["podSelector"])} == set(CLIENTS)
    assert all("podSelector" in peer for peer in rule["from"])
    assert rule["ports"] == [{"port": "redis"}]
    # The api's HTTP port from anywhere; worker and webhook metrics from the monitoring namespace.
    assert policies["conveyor-api"]["ingress"] == [{"ports": [{"port": "http"}]}]
    [metrics] = policies["conveyor-metrics"]["ingress"]
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": monitoring}}]
    assert {w["metadata"]["name"] for w in selected(docs, policies["conveyor-metrics"]["podSelector"])} == \
        {"conveyor-worker", "conveyor-webhooks"}


def test_a_selector_that_names_no_pod_is_caught() -> None:
    docs = rendered("cpu")
    assert not selected(docs, {"matchLabels": {"app.kubernetes.io/name": "conveyor-wrker"}})
    assert not selected(docs, {"matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In",
                                                     "values": ["conveyor-redis-0"]}]})
    with pytest.raises(ValueError, match="NotIn"):
        selected(docs, {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["b"]}]})
