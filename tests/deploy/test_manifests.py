"""Static validation of deploy/ (Docker does not run here): the Kubernetes manifests of each overlay,
rendered by tests/deploy/kustomize.py, against the Kubernetes API schemas kubernetes-validate ships;
the KEDA ScaledObject against its CRD's schema (tests/deploy/keda-scaledobject.schema.json); the
compose file against the compose-spec schema check-jsonschema ships; and what ties them to the code:
settings names and values, drain time, probes, the api endpoint and field the scaler reads; and the
hardening (issue 39): no Secret in the base, one Secret key for the Redis password, Valkey with a
password, maxmemory and noeviction, PodDisruptionBudgets and NetworkPolicies that select real pods."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from redis.connection import parse_url

from conveyor.launcher.roles import API_SHUTDOWN_S
from conveyor.settings import ENV_PREFIX, Settings
from conveyor.wire.health import QueueDepth
from tests.deploy.kustomize import containers, find, load_all, render
from tests.deploy.pods import conveyor_containers, redis_url

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ["cpu", "gpu", "scale-to-zero"]
K8S_VERSION = "1.30.0"  # oldest Kubernetes these manifests target (policy/v1 PDB, startup probes)
KEDA_SCHEMA = json.loads((Path(__file__).with_name("keda-scaledobject.schema.json")).read_text())
SECRET_EXAMPLE = K8S / "examples" / "secret.example.yaml"
SECRET = "conveyor-secrets"
PASSWORD_KEY = "REDIS_PASSWORD"


def rendered(overlay: str) -> list[dict[str, Any]]:
    return render(K8S / "overlays" / overlay)


def validate(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("keda.sh/"):
        jsonschema.validate(doc, KEDA_SCHEMA)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_manifest_is_valid(overlay: str) -> None:
    docs = rendered(overlay)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Deployment", "conveyor-api"), ("Service", "conveyor-api"),
            ("PodDisruptionBudget", "conveyor-api"), ("Deployment", "conveyor-worker"),
            ("Deployment", "conveyor-webhooks"), ("StatefulSet", "conveyor-redis"),
            ("ConfigMap", "conveyor-settings"), ("PodDisruptionBudget", "conveyor-worker"),
            ("NetworkPolicy", "conveyor-redis"), ("NetworkPolicy", "conveyor-api"),
            ("NetworkPolicy", "conveyor-metrics"), ("ScaledObject", "conveyor-worker")} <= kinds
    # The Secret is created once, outside kustomize: `kubectl apply -k` must never reset real keys.
    assert not [d for d in docs if d["kind"] == "Secret"]
    for doc in docs:
        validate(doc)


def example_secret() -> dict[str, str]:
    [secret] = load_all(SECRET_EXAMPLE)
    validate(secret)
    assert secret["metadata"]["name"] == SECRET
    data: dict[str, str] = secret["stringData"]
    return data


def test_the_example_secret_holds_every_key_the_pods_read() -> None:
    docs = rendered("gpu")
    read = {env["valueFrom"]["secretKeyRef"]["key"] for c in containers(docs) for env in c.get("env", [])
            if "secretKeyRef" in env.get("valueFrom", {})}
    read |= {item["key"] for doc in docs if doc["kind"] in ("Deployment", "StatefulSet")
             for volume in doc["spec"]["template"]["spec"].get("volumes", []) if "secret" in volume
             for item in volume["secret"]["items"]}
    assert read == set(example_secret())


def test_the_validators_reject_a_broken_manifest() -> None:
    """The checks can fail: a misspelt field in a Deployment and in the ScaledObject."""
    docs = rendered("cpu")
    worker = find(docs, "Deployment", "conveyor-worker")
    worker["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(worker)
    scaler = find(docs, "ScaledObject", "conveyor-worker")
    scaler["spec"]["minReplicas"] = 0
    with pytest.raises(jsonschema.ValidationError):
        validate(scaler)
    scaler["spec"].pop("minReplicas")
    scaler["spec"]["triggers"][0]["metadata"]["lagCount"] = 8  # metadata values are strings
    with pytest.raises(jsonschema.ValidationError):
        validate(scaler)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_settings_are_conveyors(overlay: str) -> None:
    """Every ConfigMap key is a setting's environment name, and the values parse as those settings."""
    docs = rendered(overlay)
    data = find(docs, "ConfigMap", "conveyor-settings")["data"]
    names = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    assert set(data) <= names, set(data) - names
    secrets = example_secret()
    for container in conveyor_containers(docs):
        for env in container.get("env", []):
            assert env["name"] in names | {"REDIS_URL", "REDIS_PASSWORD"}, env["name"]
    password = secrets[PASSWORD_KEY]
    url = redis_url(find(docs, "Deployment", "conveyor-api")).replace("$(REDIS_PASSWORD)", password)
    assert parse_url(url)["password"] == password
    settings = Settings.model_validate({k.removeprefix(ENV_PREFIX).lower(): v for k, v in data.items()}
                                       | {"redis_url": url})
    json.loads(secrets["api-keys.json"])
    json.loads(secrets["webhook-secrets.json"])
    worker = find(docs, "Deployment", "conveyor-worker")["spec"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] > settings.drain_timeout
    [container] = worker["containers"]
    # The worker's /health fails when its step loop hangs (conveyor/worker/liveness.py); /metrics does not.
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "metrics"}
    assert {"containerPort": settings.worker_metrics_port, "name": "metrics"} in container["ports"]
    # The api: preStop holds SIGTERM back while its endpoint leaves the Service; the grace period
    # covers that sleep plus uvicorn's graceful shutdown.
    api = find(docs, "Deployment", "conveyor-api")["spec"]["template"]["spec"]
    command = api["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and float(command[1]) > 0
    assert api["terminationGracePeriodSeconds"] > float(command[1]) + API_SHUTDOWN_S


def test_the_overlays_differ_where_they_should() -> None:
    cpu, gpu, zero = (rendered(o) for o in OVERLAYS)
    gpu_worker = find(gpu, "Deployment", "conveyor-worker")["spec"]["template"]["spec"]["containers"][0]
    assert gpu_worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu_worker["image"] == "conveyor:cuda"
    assert {"name": "CONVEYOR_DEVICE", "value": "cuda"} in gpu_worker["env"]
    assert gpu_worker["env"][0]["name"] == "REDIS_PASSWORD"  # the base's env is kept, the patch's added
    cpu_worker = find(cpu, "Deployment", "conveyor-worker")["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in cpu_worker["resources"]["limits"]
    assert all(c["image"] == "conveyor:cpu" for c in containers(cpu) if c["name"] != "redis")
    api = find(cpu, "Deployment", "conveyor-api")["spec"]["template"]["spec"]["containers"][0]
    assert (api["livenessProbe"]["httpGet"]["path"], api["readinessProbe"]["httpGet"]["path"]) == \
        ("/health", "/ready")
    assert find(gpu, "ScaledObject", "conveyor-worker")["spec"]["minReplicaCount"] >= 1
    # Scale to zero: no worker, and the api keeps its /ready probe (ready without a worker).
    assert find(zero, "ScaledObject", "conveyor-worker")["spec"]["minReplicaCount"] == 0
    zero_api = find(zero, "Deployment", "conveyor-api")["spec"]["template"]["spec"]["containers"][0]
    assert zero_api["readinessProbe"]["httpGet"]["path"] == "/ready"


def test_the_scaler_reads_the_apis_queue_depth() -> None:
    """One metrics-api trigger on the api Service's GET /queue, on a field the endpoint answers, one
    worker per unit: the replicas are workers_wanted (tests/api/test_scaling_signal.py computes it)."""
    docs = rendered("gpu")
    scaler = find(docs, "ScaledObject", "conveyor-worker")["spec"]
    assert scaler["scaleTargetRef"]["name"] == "conveyor-worker"
    [trigger] = scaler["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "metrics-api" and meta["format"] == "json"
    url = urlsplit(meta["url"])
    service = find(docs, "Service", "conveyor-api")
    assert url.hostname is not None and url.hostname.split(".")[0] == service["metadata"]["name"]
    assert (url.port or 80) in {p["port"] for p in service["spec"]["ports"]}
    assert url.path == "/queue" and meta["valueLocation"] in QueueDepth.model_fields
    assert (meta["valueLocation"], float(meta["targetValue"]), float(meta["activationTargetValue"])) == \
        ("workers_wanted", 1.0, 0.0)


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_compose_is_valid_and_the_check_can_fail(tmp_path: Path) -> None:
    compose = REPO / "deploy" / "compose.yaml"
    result = check_compose(compose)
    assert result.returncode == 0, result.stdout + result.stderr
    spec = yaml.safe_load(compose.read_text())
    gpu = spec["services"]["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    redis = spec["services"]["redis"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert redis["volumes"] == ["redis-data:/data"]
    drain = float(spec["x-conveyor-env"]["CONVEYOR_DRAIN_TIMEOUT"])
    for name in ("worker", "worker-gpu"):
        assert float(spec["services"][name]["stop_grace_period"].removesuffix("s")) > drain
    assert {"monitoring"} == set(spec["services"]["grafana"]["profiles"])
    dashboard = REPO / "deploy" / "grafana" / "conveyor.json"
    assert any(v.startswith(f"./grafana/{dashboard.name}:") for v in spec["services"]["grafana"]["volumes"])
    broken = tmp_path / "compose.yaml"
    spec["services"]["worker"]["stop_grace"] = "45s"
    broken.write_text(yaml.safe_dump(spec))
    assert check_compose(broken).returncode != 0
