"""What the manifest tests ask of rendered objects: the workloads and their pod labels, label
selectors as Kubernetes matches them, the containers that run Conveyor, and their Redis URL."""

from __future__ import annotations

from typing import Any

from tests.deploy.kustomize import Doc, containers

WORKLOADS = ("Deployment", "StatefulSet")


def workloads(docs: list[Doc]) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] in WORKLOADS]


def pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels; matchExpressions with In, the only operator used here)."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        if expression["operator"] != "In":
            raise ValueError(f"operator {expression['operator']}: extend tests/deploy/pods.py")
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def selected(docs: list[Doc], selector: dict[str, Any]) -> list[Doc]:
    """The workloads whose pods `selector` selects."""
    return [w for w in workloads(docs) if selects(selector, pod_labels(w))]


def conveyor_containers(docs: list[Doc]) -> list[Doc]:
    """Containers of the conveyor image (not Valkey's)."""
    return [c for c in containers(docs) if c["image"].split(":")[0] == "conveyor"]


def env_of(container: Doc) -> list[Doc]:
    env: list[Doc] = container.get("env", [])
    return env


def redis_url(workload: Doc) -> str:
    [container] = workload["spec"]["template"]["spec"]["containers"]
    [url] = [env["value"] for env in env_of(container) if env["name"] == "REDIS_URL"]
    return str(url)
