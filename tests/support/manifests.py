"""deploy/kubernetes as the kustomization applies it: its YAML documents and the objects they declare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.support.models import ROOT

K8S = ROOT / "deploy" / "kubernetes"


def documents(path: Path) -> list[dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert all(isinstance(doc, dict) for doc in docs), path
    return docs


def kustomization() -> dict[str, Any]:
    (doc,) = documents(K8S / "kustomization.yaml")
    return doc


def objects() -> list[tuple[str, dict[str, Any]]]:
    """(file name, object) for every object the kustomization applies."""
    return [(name, doc) for name in kustomization()["resources"] for doc in documents(K8S / name)]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in objects() if doc["kind"] == kind]


def scaled_objects() -> list[dict[str, Any]]:
    return of_kind("ScaledObject")


def scaled_object_for(model: str) -> dict[str, Any]:
    (found,) = [so for so in scaled_objects() if so["metadata"]["labels"].get("inferq.dev/model") == model]
    return found
