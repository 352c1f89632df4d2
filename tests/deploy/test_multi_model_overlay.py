"""The two-models overlay (deploy/k8s/overlays/two-models, issue 41): its manifests are valid; each
configured model has one worker Deployment that runs it (CONVEYOR_WORKER_MODEL), one budget and one
KEDA ScaledObject scaling that Deployment on that model's queue (GET /queue?model=NAME); the api and
each model's workers mount the model's PATH; Valkey and the metrics policy admit every worker."""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import parse_qs, urlsplit

from conveyor.jobqueue.models import ModelCatalog
from conveyor.settings import ENV_PREFIX, Settings
from conveyor.wire.health import QueueDepth
from tests.deploy.kustomize import Doc, find
from tests.deploy.pods import env_of, selected, workloads
from tests.deploy.test_manifests import rendered, validate

OVERLAY = "two-models"
DEFAULT = "default"  # the default model's served name: whatever it is, its queue is /queue's default


def docs() -> list[Doc]:
    return rendered(OVERLAY)


def worker_settings(built: list[Doc], worker: Doc) -> Settings:
    """The settings a worker pod starts with: the ConfigMap, then its own env (REDIS_* aside)."""
    data = find(built, "ConfigMap", "conveyor-settings")["data"]
    [container] = worker["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in env_of(container)
           if "value" in e and e["name"].startswith(ENV_PREFIX)}
    merged = {k.removeprefix(ENV_PREFIX).lower(): v for k, v in (data | env).items()}
    return Settings.model_validate(merged | {"redis_url": "redis://conveyor-redis:6379/0"})


def workers(built: list[Doc]) -> list[Doc]:
    return [w for w in workloads(built)
            if w["spec"]["template"]["spec"]["containers"][0]["args"] == ["worker"]]


def mounts(workload: Doc) -> dict[str, str]:
    """mountPath → the claim it mounts, for PersistentVolumeClaim volumes."""
    spec = workload["spec"]["template"]["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec.get("volumes", [])
              if "persistentVolumeClaim" in v}
    return {m["mountPath"]: claims[m["name"]] for c in spec["containers"] for m in c.get("volumeMounts", [])
            if m["name"] in claims}


def claim_of(workload: Doc, path: str) -> str | None:
    return next((claim for at, claim in mounts(workload).items()
                 if PurePosixPath(path).is_relative_to(at)), None)


def test_every_manifest_is_valid() -> None:
    built = docs()
    for doc in built:
        validate(doc)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in built}
    assert {("Deployment", "conveyor-worker-small"), ("ScaledObject", "conveyor-worker-small"),
            ("PodDisruptionBudget", "conveyor-worker-small"), ("ScaledObject", "conveyor-worker")} <= kinds
    assert not [d for d in built if d["kind"] == "Secret"]


def test_each_model_has_its_workers_and_a_scaler_on_its_queue() -> None:
    built = docs()
    by_model = {worker_settings(built, w).worker_model: w for w in workers(built)}
    assert len(by_model) == len(workers(built))  # one Deployment per model
    catalog = ModelCatalog.from_settings(worker_settings(built, by_model[None]), DEFAULT)
    assert len(catalog.names) >= 2
    assert set(by_model) == set(catalog.queues)
    scalers = {d["spec"]["scaleTargetRef"]["name"]: d["spec"] for d in built if d["kind"] == "ScaledObject"}
    assert set(scalers) == {w["metadata"]["name"] for w in by_model.values()}
    for queue, worker in by_model.items():
        [trigger] = scalers[worker["metadata"]["name"]]["triggers"]
        meta = trigger["metadata"]
        assert trigger["type"] == "metrics-api" and meta["valueLocation"] in QueueDepth.model_fields
        assert (meta["valueLocation"], meta["targetValue"], meta["activationTargetValue"]) == \
            ("workers_wanted", "1", "0")
        url = urlsplit(meta["url"])
        assert (url.hostname or "").split(".")[0] == "conveyor-api" and url.path == "/queue"
        asked = parse_qs(url.query).get("model")
        # GET /queue counts the queue the api routes this model's jobs to: the default's without `model`.
        name = catalog.resolve(asked[0] if asked else None)
        assert name is not None and catalog.queue_of(name) == queue, meta["url"]


def test_the_api_and_each_models_workers_mount_its_path() -> None:
    built = docs()
    api = find(built, "Deployment", "conveyor-api")
    for worker in workers(built):
        settings = worker_settings(built, worker)
        for name, path in settings.extra_models.items():
            assert claim_of(api, path) is not None, (name, path)  # the api reads its tokenizer
            if settings.worker_model == name:
                assert claim_of(worker, path) == claim_of(api, path), (name, path)
    for workload in (api, *workers(built)):  # no pod can change a model the others load
        for container in workload["spec"]["template"]["spec"]["containers"]:
            shared = [m for m in container["volumeMounts"] if m["mountPath"] in mounts(workload)]
            assert all(m.get("readOnly") for m in shared), workload["metadata"]["name"]


def test_budgets_anti_affinity_and_policies_cover_every_worker() -> None:
    built = docs()
    policies = {d["metadata"]["name"]: d["spec"] for d in built if d["kind"] == "NetworkPolicy"}
    budgets = [d["spec"]["selector"] for d in built if d["kind"] == "PodDisruptionBudget"]
    [valkey_rule] = policies["conveyor-redis"]["ingress"]
    valkey_clients = [w for peer in valkey_rule["from"] for w in selected(built, peer["podSelector"])]
    for worker in workers(built):
        assert [s for s in budgets if selected(built, s) == [worker]], worker["metadata"]["name"]
        assert not [s for s in budgets if worker in selected(built, s) and len(selected(built, s)) > 1]
        [term] = worker["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"]
        assert selected(built, term["podAffinityTerm"]["labelSelector"]) == [worker]
        assert worker in valkey_clients
        assert worker in selected(built, policies["conveyor-metrics"]["podSelector"])
