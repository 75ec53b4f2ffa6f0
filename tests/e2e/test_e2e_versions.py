"""A model's versions with real API and worker processes: numbered folders served apart, unpinned submits split by the
model's traffic shares (exactly), pinned ones on their version, every job naming the version and the weights that
answered it, a version that fails to load getting no job, and tritonclient on each version."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton

from inferq.workers.formats import save_export
from tests.support.stack import Stack, new_stack, serving


class Scale(torch.nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.register_buffer("factor", torch.tensor(factor))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def write_version(model: Path, version: int, factor: float, **override: Any) -> str:
    """Version ``version`` of ``model``: a torch.export program that multiplies by ``factor``; its weights' SHA-256."""
    folder = model / str(version)
    folder.mkdir(parents=True)
    save_export(Scale(factor), torch.zeros(2, 2), folder / "model.pt2")
    if override:
        (folder / "config.json").write_text(json.dumps(override))
    return hashlib.sha256((folder / "model.pt2").read_bytes()).hexdigest()


def write_model(models_dir: Path, rollout: dict[str, Any] | None = None) -> Path:
    model = models_dir / "scale"
    model.mkdir()
    config: dict[str, Any] = {
        "handler": "tensor",
        "format": "export",
        "weights": "model.pt2",
        "input": {"kind": "tensor", "shape": [2], "dtype": "float32"},
        "max_batch": 16,
    }
    if rollout is not None:
        config["rollout"] = rollout
    (model / "config.json").write_text(json.dumps(config))
    return model


def submit(stack: Stack, value: float, version: int | None = None) -> dict[str, Any]:
    params = {"version": version} if version is not None else {}
    response = httpx.post(
        f"{stack.base}/v1/models/scale/jobs",
        json={"inputs": [value, value]},
        params=params,
        headers={"Prefer": "wait=30"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_versions_split_by_their_shares_and_each_job_names_its_version_and_weights(tmp_path: Path) -> None:
    stack = new_stack(tmp_path)
    model = write_model(stack.models_dir, rollout={"traffic": {"1": 80, "2": 20}})
    hashes = {1: write_version(model, 1, 1.0), 2: write_version(model, 2, 2.0)}
    with serving(stack):
        stack.start_api()
        stack.start_worker("scale", name="v1")
        stack.start_worker("scale@2", name="v2")
        stack.wait_for_worker("scale")
        stack.wait_for_worker("scale@2")
        listed = httpx.get(f"{stack.base}/v1/models/scale", timeout=10).json()
        versions = {v["version"]: v for v in listed["versions"]}
        assert {v: (s["state"], s["weights_sha256"], s["share"]) for v, s in versions.items()} == {
            1: ("ready", hashes[1], 80.0),
            2: ("ready", hashes[2], 20.0),
        }

        views = [submit(stack, float(n)) for n in range(100)]
        by_version = Counter(view["version"] for view in views)
        assert abs(by_version[2] - 20) <= 2 and by_version[1] + by_version[2] == 100, by_version
        for n, view in enumerate(views):  # each ran on the version it names, with that version's weights
            factor = float(view["version"])
            assert view["result"] == {"output": [n * factor, n * factor]}, view
            assert view["weights_sha256"] == hashes[view["version"]]
            assert view["model"] == "scale"
        pinned = [submit(stack, 3.0, version=1) for _ in range(5)]
        assert {(v["version"], tuple(v["result"]["output"])) for v in pinned} == {(1, (3.0, 3.0))}
        read = httpx.get(f"{stack.base}/v1/jobs/{pinned[0]['id']}", timeout=10).json()
        assert (read["version"], read["weights_sha256"]) == (1, hashes[1])
        unknown = httpx.post(f"{stack.base}/v1/models/scale/jobs", json={"inputs": [1, 1]}, params={"version": 9})
        assert unknown.status_code == 404 and "no version 9" in unknown.text

        host = stack.base.removeprefix("http://")
        with triton.InferenceServerClient(host, network_timeout=60) as client:
            for version in ("1", "2"):
                meta = client.get_model_metadata("scale", model_version=version)
                assert meta["versions"] == ["1", "2"] and meta["inputs"][0]["shape"] == [2]
                assert client.is_model_ready("scale", model_version=version)
                tensor = triton.InferInput("tensor", [2], "FP32")
                tensor.set_data_from_numpy(np.array([1.5, 2.5], dtype=np.float32))
                answer = client.infer("scale", [tensor], model_version=version)
                assert answer.get_response()["model_version"] == version
                assert answer.as_numpy("output").tolist() == [1.5 * int(version), 2.5 * int(version)]


def test_a_version_that_fails_to_load_gets_no_job_and_says_why(tmp_path: Path) -> None:
    stack = new_stack(tmp_path)
    model = write_model(stack.models_dir)  # no traffic: the highest version that serves takes every submit
    write_version(model, 1, 1.0)
    write_version(model, 2, 2.0, input={"kind": "tensor", "shape": [3], "dtype": "float32"}, warmup=True)
    with serving(stack):
        stack.start_api()
        stack.start_worker("scale", name="v1")
        broken = stack.start_worker("scale@2", name="v2")
        stack.wait_for_worker("scale")
        assert broken.wait(timeout=60) != 0
        views = [submit(stack, float(n)) for n in range(20)]
        assert Counter(v["version"] for v in views) == {1: 20}
        listed = httpx.get(f"{stack.base}/v1/models", timeout=10).json()
        (scale,) = [m for m in listed["models"] if m["name"] == "scale"]
        versions = {v["version"]: v for v in scale["versions"]}
        assert versions[1]["state"] == "ready" and versions[1]["share"] == 100.0
        assert versions[2]["state"] == "failed" and versions[2]["share"] == 0.0
        assert "scale" in versions[2]["reason"] and versions[2]["workers"] == 0
        assert scale["input"]["shape"] == [3]  # the highest version's, as its path documents


@pytest.mark.parametrize("pinned", [None, 2])
def test_a_model_without_a_serving_version_queues_by_its_shares(tmp_path: Path, pinned: int | None) -> None:
    """No worker yet (a cold start): the configured shares decide, and the jobs wait in that version's queue."""
    stack = new_stack(tmp_path)
    model = write_model(stack.models_dir, rollout={"traffic": {"2": 100}})
    write_version(model, 1, 1.0)
    write_version(model, 2, 2.0)
    with serving(stack):
        stack.start_api()
        params = {"version": pinned} if pinned else {}
        accepted = httpx.post(f"{stack.base}/v1/models/scale/jobs", json={"inputs": [1, 1]}, params=params).json()
        assert accepted["version"] == 2
        assert stack.redis().llen("rq:queue:inferq.scale@2") == 1
        stack.start_worker("scale@2", name="v2")
        done = httpx.get(f"{stack.base}/v1/jobs/{accepted['id']}", params={"wait": 30}, timeout=60).json()
        assert done["status"] == "finished" and done["result"] == {"output": [2.0, 2.0]}
