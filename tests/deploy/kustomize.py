"""A small kustomize for the manifests under deploy/k8s (kustomize itself is not installed here):
resources (files, or directories with a kustomization.yaml: base and stacked overlays), `images`
(name → newName:newTag) and `patches` by path, applied as a strategic merge the way kustomize applies
them to these kinds: maps merge, lists of named items (containers, env, volumes: merge key `name`)
merge by name, other lists are replaced (no patch here touches a list keyed otherwise). Anything
else in a kustomization.yaml is refused, so no manifest depends on a feature this skips."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "images", "patches"}
Doc = dict[str, Any]


class Unsupported(ValueError):
    pass


def render(directory: Path) -> list[Doc]:
    """Every resource the kustomization in `directory` builds, in order."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    if extra := set(spec) - SUPPORTED:
        raise Unsupported(f"{directory}/kustomization.yaml uses {sorted(extra)}: "
                          "extend tests/deploy/kustomize.py")
    docs: list[Doc] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        docs += render(path) if path.is_dir() else load_all(path)
    for patch in spec.get("patches", []):
        if set(patch) != {"path"}:
            raise Unsupported(f"patch {patch}: only `path` patches are rendered here")
        for change in load_all(directory / patch["path"]):
            target = find(docs, change["kind"], change["metadata"]["name"])
            merged = merge(target, change)
            target.clear()
            target.update(merged)
    for image in spec.get("images", []):
        for container in containers(docs):
            if container["image"].split(":")[0] == image["name"]:
                container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return docs


def load_all(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise KeyError(f"no {kind} {name} to patch")


def merge(base: Any, change: Any) -> Any:
    if isinstance(base, dict) and isinstance(change, dict):
        out = copy.deepcopy(base)
        for key, value in change.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(change, list) and all(_named(x) for x in base + change):
        out = copy.deepcopy(base)
        for item in change:
            at = next((i for i, old in enumerate(out) if old["name"] == item["name"]), None)
            if at is None:
                out.append(copy.deepcopy(item))
            else:
                out[at] = merge(out[at], item)
        return out
    return copy.deepcopy(change)


def _named(item: Any) -> bool:
    return isinstance(item, dict) and "name" in item


def containers(docs: list[Doc]) -> list[Doc]:
    return [c for doc in docs if doc["kind"] in ("Deployment", "StatefulSet")
            for c in doc["spec"]["template"]["spec"]["containers"]]
