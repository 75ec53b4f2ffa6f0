"""`inferq manifests version MODEL N`: the Kubernetes objects that serve one more version of a model, made from the
model's own worker manifest (``deploy/kubernetes/worker-MODEL.yaml``), as `inferq up` serves versions: a worker
Deployment of its own (``--model MODEL@N``) and a KEDA ScaledObject on that version's RQ queues, started
registries and fair backlogs. Every other setting (image, resources, GPU, scaling bounds, Redis address) is the
model's.

Written here rather than as a kustomize overlay: an overlay cannot turn ``digits`` into ``digits@2`` inside a
command line and four Redis key names without a patch per field, which a person would have to write per version.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

from inferq.shared import keys
from inferq.shared.errors import AppError

DEFAULT_DIR = Path("deploy/kubernetes")
VERSION_LABEL = "inferq.dev/version"


def worker_name(model: str, version: int) -> str:
    """The Deployment and ScaledObject name of a version's workers: the model's for version 1."""
    return f"worker-{model}" if version == 1 else f"worker-{model}-v{version}"


def version_objects(model_docs: list[dict[str, Any]], model: str, version: int) -> list[dict[str, Any]]:
    """The model's worker Deployment and ScaledObject, made to serve ``version``."""
    if version < 2:
        raise AppError("version 1 is served by the model's own manifest; give 2 or higher")
    from inferq.shared.lifecycle import layout  # the server's packages (rq): imported when the command runs

    served = keys.served_name(model, version)
    base, name = worker_name(model, 1), worker_name(model, version)
    lists: dict[str, str] = {}
    for lane in keys.LANES:
        base_keys = layout.queue_keys(keys.queue_name(model, lane))
        served_keys = layout.queue_keys(keys.queue_name(served, lane))
        for field in ("queue", "started", "fair_backlog"):
            lists[getattr(base_keys, field)] = getattr(served_keys, field)
    out = []
    for doc in model_docs:
        if doc.get("metadata", {}).get("name") != base or doc.get("kind") not in ("Deployment", "ScaledObject"):
            continue
        made = copy.deepcopy(doc)
        made["metadata"]["name"] = name
        made["metadata"].setdefault("labels", {})[VERSION_LABEL] = str(version)
        if made["kind"] == "Deployment":
            spec = made["spec"]
            for labels in (
                made["metadata"]["labels"],
                spec["selector"]["matchLabels"],
                spec["template"]["metadata"]["labels"],
            ):
                if labels.get("app.kubernetes.io/instance") == base:
                    labels["app.kubernetes.io/instance"] = name
            spec["template"]["metadata"]["labels"][VERSION_LABEL] = str(version)
            for container in spec["template"]["spec"]["containers"]:
                command = container.get("command", [])
                at = [i for i, arg in enumerate(command[:-1]) if arg == "--model" and command[i + 1] == model]
                if not at:
                    raise AppError(f"{base}'s container {container['name']!r} does not run --model {model}")
                for i in at:
                    command[i + 1] = served
        else:
            made["spec"]["scaleTargetRef"]["name"] = name
            for trigger in made["spec"]["triggers"]:
                listed = trigger["metadata"].get("listName")
                if listed not in lists:
                    raise AppError(f"{base}'s ScaledObject counts {listed!r}, not one of {model}'s RQ keys")
                trigger["metadata"]["listName"] = lists[listed]
        out.append(made)
    if sorted(doc["kind"] for doc in out) != ["Deployment", "ScaledObject"]:
        raise AppError(f"the manifest has no Deployment and ScaledObject named {base}")
    return out


def render(folder: Path, model: str, version: int) -> str:
    import yaml

    source = folder / f"{worker_name(model, 1)}.yaml"
    try:
        docs = [doc for doc in yaml.safe_load_all(source.read_text()) if doc]
    except (OSError, yaml.YAMLError) as exc:
        raise AppError(f"cannot read {source}: {exc}") from None
    served = keys.served_name(model, version)
    header = (
        f"# Version {version} of {model}: its own workers (--model {served}), scaled by KEDA on its own queues.\n"
        f"# Made by `inferq manifests version {model} {version}` from {source.name}; remove it (and its line in\n"
        "# kustomization.yaml) once the version takes no traffic and its queues are empty.\n"
    )
    return header + yaml.safe_dump_all(version_objects(docs, model, version), sort_keys=False)


def add_parser(sub: Any) -> None:
    manifests = sub.add_parser(
        "manifests",
        help="Kubernetes manifests for one more version of a model (its workers and KEDA scaling)",
        description="inferq manifests version MODEL N [--dir deploy/kubernetes] [--write]: prints (or writes, and "
        "names in kustomization.yaml) worker-MODEL-vN.yaml, made from worker-MODEL.yaml",
    )
    manifests.add_argument("what", choices=("version",))
    manifests.add_argument("model")
    manifests.add_argument("version", type=int)
    manifests.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the manifests' folder (deploy/kubernetes)")
    manifests.add_argument("--write", action="store_true", help="write the file and add it to kustomization.yaml")


def cmd_manifests(args: argparse.Namespace) -> int:
    text = render(args.dir, args.model, args.version)
    if not args.write:
        print(text, end="")
        return 0
    target = args.dir / f"{worker_name(args.model, args.version)}.yaml"
    target.write_text(text)
    kustomization = args.dir / "kustomization.yaml"
    lines = kustomization.read_text().splitlines(keepends=True)
    if not any(line.strip() == f"- {target.name}" for line in lines):
        at = max(i for i, line in enumerate(lines) if line.strip().startswith("- worker-"))
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        lines.insert(at + 1, f"{indent}- {target.name}\n")
        kustomization.write_text("".join(lines))
    print(f"wrote {target} and named it in {kustomization}; kubectl apply -k {args.dir}")
    return 0
