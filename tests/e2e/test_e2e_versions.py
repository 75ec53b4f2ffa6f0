"""A model's versions with real API and worker processes: numbered folders served apart, unpinned submits split by the
model's traffic shares (exactly), pinned ones on their version, every job naming the version and the weights that
answered it, a version that fails to load getting no job, and tritonclient on each version."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton

from inferq.client import Client
from inferq.shared.redis_server import free_port
from inferq.workers.formats import save_export
from tests.support.builders import Scale
from tests.support.echo import POISON
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until


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
        with Client(stack.base) as client:  # the SDK pins too, and reads each version
            assert client.run("scale", inputs=[1.0, 1.0], version=2).result == {"output": [2.0, 2.0]}
            assert [(v.version, v.state, v.weights_sha256) for v in client.model("scale").versions] == [
                (1, "ready", hashes[1]),
                (2, "ready", hashes[2]),
            ]
        cli = subprocess.run(
            [sys.executable, "-m", "inferq", "submit", "scale", "--json", '{"inputs": [5, 5]}', "--version", "1"]
            + ["--wait", "30", "--api", stack.base],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        printed = json.loads(cli.stdout)
        assert (printed["version"], printed["result"]) == (1, {"output": [5.0, 5.0]})
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


def test_an_operator_sets_the_traffic_through_the_api_and_every_api_process_follows_it(tmp_path: Path) -> None:
    """PUT /v1/models/{m}/rollout stands over config.json's rollout in every API process (here a second one), with
    an operator's key (a tenant's own is 403); DELETE goes back to the config's. The SDK and `inferq models rollout`
    do the same."""
    tenants = [{"name": "ops", "key": "k1", "operator": True}, {"name": "acme", "key": "k2"}]
    stack = new_stack(tmp_path, INFERQ_TENANTS=json.dumps(tenants))
    model = write_model(stack.models_dir)  # no rollout: the highest version takes every unpinned submit
    write_version(model, 1, 1.0)
    write_version(model, 2, 2.0)
    key = {"Authorization": "Bearer k1"}
    with serving(stack):
        stack.start_api()
        other = f"http://127.0.0.1:{free_port()}"
        stack.start("api", "--port", other.rsplit(":", 1)[1], name="api2")
        stack.start_worker("scale", name="v1")
        stack.start_worker("scale@2", name="v2")
        stack.wait_for_worker("scale")
        stack.wait_for_worker("scale@2")
        wait_until(lambda: httpx.get(f"{other}/readyz", timeout=5).status_code == 200, 30, "the second API")

        def versions_of(base: str, count: int) -> Counter[int]:
            with Client(base, api_key="k1") as client:
                return Counter(client.run("scale", inputs=[1.0, 1.0], timeout=30).version for _ in range(count))

        assert versions_of(other, 20) == {2: 20}
        body = {"traffic": {"1": 70, "2": 30}}
        assert httpx.put(f"{stack.base}/v1/models/scale/rollout", json=body).status_code == 401
        tenant = {"Authorization": "Bearer k2"}
        assert httpx.put(f"{stack.base}/v1/models/scale/rollout", json=body, headers=tenant).status_code == 403
        bad = httpx.put(f"{stack.base}/v1/models/scale/rollout", json={"traffic": {"1": -5}}, headers=key)
        assert bad.status_code == 422 and "traffic" in bad.text
        empty = httpx.put(f"{stack.base}/v1/models/scale/rollout", json={}, headers=key)
        assert empty.status_code == 422 and "give traffic, a ramp or both" in empty.text
        answer = httpx.put(f"{stack.base}/v1/models/scale/rollout", json=body, headers=key, timeout=10)
        assert answer.status_code == 200, answer.text
        set_ = answer.json()
        assert set_["rollout"]["set_by"] == "api" and set_["rollout"]["traffic"] == {"1": 70.0, "2": 30.0}
        assert [v["share"] for v in set_["versions"]] == [70.0, 30.0]
        assert stack.redis().ttl("inferq:rollout:scale") > 29 * 86_400  # renewed by each API's reads
        told = f"{other}/v1/models/scale"
        wait_until(lambda: httpx.get(told, headers=key).json()["rollout"]["set_by"] == "api", 10, "the second API")
        split = versions_of(other, 100)  # the second API process routes by it too
        assert abs(split[2] - 30) <= 2 and split[1] + split[2] == 100, split

        cli = subprocess.run(
            [sys.executable, "-m", "inferq", "models", "rollout", "scale", "1=100", "--api", other, "--api-key", "k1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        assert "rollout (set through the API): traffic 1=100" in cli.stdout, cli.stdout
        wait_until(lambda: versions_of(stack.base, 5) == {1: 5}, 10, "the first API to follow the CLI's rollout")
        with Client(stack.base, api_key="k1") as client:
            cleared = client.clear_rollout("scale")
            assert cleared.rollout is not None and cleared.rollout["set_by"] == "config"
            assert [v.share for v in cleared.versions] == [0.0, 100.0]
        wait_until(lambda: versions_of(other, 5) == {2: 5}, 10, "the second API back on the config's rollout")
        again = httpx.delete(f"{stack.base}/v1/models/scale/rollout", headers=key)
        assert again.status_code == 404 and "config.json's holds" in again.text
        ttl = stack.redis().ttl("inferq:rollout:scale")
        assert ttl == -2  # cleared: nothing left behind


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
        assert "warm-up failed on a new worker" in versions[2]["rolled_back"]["reason"]  # told as a rollback too
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


def test_a_version_whose_jobs_fail_too_often_is_rolled_back_by_itself_and_can_be_restored(tmp_path: Path) -> None:
    stack = new_stack(tmp_path, INFERQ_TEST_SLOW_S="0")
    model = stack.models_dir / "echoes"
    model.mkdir()
    config = {
        "handler": "tests.support.echo:SlowEcho",
        "weights": "none",
        "input": {"kind": "tensor", "shape": [2], "dtype": "float32"},
        "max_batch": 8,
        "rollout": {"traffic": {"1": 50, "2": 50}},  # the default rollback: over 10 % of its last 100 jobs, from 50
    }
    (model / "config.json").write_text(json.dumps(config))
    (model / "1").mkdir()
    (model / "2").mkdir()
    (model / "2" / "config.json").write_text(json.dumps({"handler": "tests.support.echo:Flaky"}))
    told: list[dict[str, Any]] = []
    with serving(stack):
        stack.start_api()
        stack.start_worker("echoes", name="v1")
        stack.start_worker("echoes@2", name="v2")
        stack.wait_for_worker("echoes")
        stack.wait_for_worker("echoes@2")
        pubsub = stack.redis().pubsub()
        pubsub.subscribe("inferq:events")

        def one(n: int) -> dict[str, Any]:
            response = httpx.post(
                f"{stack.base}/v1/models/echoes/jobs",
                json={"inputs": [n, n]},
                headers={"Prefer": "wait=30"},
                timeout=60,
            )
            assert response.status_code in (200, 202), response.text
            return dict(response.json())

        with ThreadPoolExecutor(8) as pool:
            views = list(pool.map(one, [n for n in range(1, 801) if n != POISON]))  # v1 fails only on POISON
        while (message := pubsub.get_message(timeout=1)) is not None:
            if message["type"] == "message" and b'"rollback"' in message["data"]:
                told.append(json.loads(message["data"]))
        pubsub.close()

        listed = httpx.get(f"{stack.base}/v1/models/echoes", timeout=10).json()
        versions = {v["version"]: v for v in listed["versions"]}
        rolled = versions[2]["rolled_back"]
        assert rolled is not None and "of its last" in rolled["reason"] and versions[2]["share"] == 0.0
        assert versions[1]["rolled_back"] is None and versions[1]["share"] == 100.0
        assert [(e["model"], e["version"]) for e in told] == [("echoes", 2)] and told[0]["reason"] == rolled["reason"]
        at = datetime.fromisoformat(rolled["at"])
        on_2 = sorted((datetime.fromisoformat(v["created_at"]), v["status"]) for v in views if v["version"] == 2)
        assert 50 <= len([t for t, _ in on_2 if t <= at]) <= 200  # rolled back within 200 of its jobs
        assert [t for t, _ in on_2 if t > at + timedelta(seconds=0.5)] == []  # none routed to it after
        assert all(v["status"] == "finished" for v in views if v["version"] == 1)
        assert {v["status"] for v in views if v["version"] == 2} == {"finished", "failed"}
        metric = 'inferq_version_rolled_back{model="echoes",version="2"} 1.0'
        assert metric in httpx.get(f"{stack.base}/metrics", timeout=10).text
        assert "version 2 is rolled back" in stack.log_text()
        status = httpx.get(f"{stack.base}/v1/status", timeout=10).json()
        shown = {m["name"]: m["rolled_back"] for m in status["models"] if m["name"].startswith("echoes")}
        assert shown == {"echoes": None, "echoes@2": rolled["reason"]}

        restored = httpx.post(f"{stack.base}/v1/models/echoes/versions/2/restore", timeout=10)
        assert restored.status_code == 200 and restored.json()["versions"][1]["rolled_back"] is None
        again = httpx.post(f"{stack.base}/v1/models/echoes/versions/2/restore", timeout=10)
        assert again.status_code == 404
        after = [one(n) for n in (1, 2, 3, 4, 6, 7)]  # no multiple of 5: nothing fails, nothing rolls back
        assert {v["version"] for v in after} == {1, 2}


def echo_versions(models_dir: Path, rollout: dict[str, Any]) -> None:
    """Model ``echoes``: versions 1 and 2 of the echo handler (no weights), shared as ``rollout`` says."""
    model = models_dir / "echoes"
    config = {
        "handler": "tests.support.echo:SlowEcho",
        "weights": "none",
        "input": {"kind": "tensor", "shape": [2], "dtype": "float32"},
        "max_batch": 16,
        "rollout": rollout,
    }
    for version in ("1", "2"):
        (model / version).mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(config))


@pytest.mark.timeout(900)  # 5,000 jobs: about a minute on 2 idle cores, several on a loaded one
def test_a_ramp_to_10_percent_over_5000_jobs_sends_10_percent_and_each_runs_where_its_view_says(tmp_path: Path) -> None:
    stack = new_stack(tmp_path, INFERQ_TEST_SLOW_S="0")
    echo_versions(stack.models_dir, {"ramp": {"version": 2, "steps": [10], "interval_s": 3600}})
    with serving(stack):
        stack.start_api()
        stack.start_worker("echoes", extra=["--name", "only-v1"], name="v1")
        stack.start_worker("echoes@2", extra=["--name", "only-v2"], name="v2")
        stack.wait_for_worker("echoes")
        stack.wait_for_worker("echoes@2")
        listed = httpx.get(f"{stack.base}/v1/models/echoes", timeout=10).json()
        assert {v["version"]: v["share"] for v in listed["versions"]} == {1: 90.0, 2: 10.0}

        def one(n: int) -> dict[str, Any]:
            url = f"{stack.base}/v1/models/echoes/jobs"
            response = httpx.post(url, json={"inputs": [n, n]}, headers={"Prefer": "wait=60"}, timeout=90)
            assert response.status_code == 200, response.text
            return dict(response.json())

        with ThreadPoolExecutor(16) as pool:
            views = list(pool.map(one, [n for n in range(5000) if n != POISON]))
        by_version = Counter(view["version"] for view in views)
        assert abs(by_version[2] / len(views) - 0.10) <= 0.02, by_version
        assert {view["status"] for view in views} == {"finished"}  # no job fails
        assert all(view["worker"] == f"only-v{view['version']}" for view in views)  # each ran where it says


def test_a_pinned_job_retried_after_its_worker_is_killed_runs_on_its_version_again(tmp_path: Path) -> None:
    stack = new_stack(tmp_path)
    echo_versions(stack.models_dir, {"traffic": {"2": 100}})
    with serving(stack):
        stack.start_api()
        doomed = stack.start_worker("echoes", name="v1", env={"INFERQ_TEST_SLOW_S": "3"})
        stack.start_worker("echoes@2", extra=["--name", "v2-only"], name="v2", env={"INFERQ_TEST_SLOW_S": "0"})
        stack.wait_for_worker("echoes")
        accepted = httpx.post(f"{stack.base}/v1/models/echoes/jobs", json={"inputs": [4, 4]}, params={"version": 1})
        job_id = accepted.json()["id"]

        def status() -> str:
            return str(httpx.get(f"{stack.base}/v1/jobs/{job_id}", timeout=10).json()["status"])

        wait_until(lambda: status() == "started", 30, "the pinned job to start on version 1")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        stack.start_worker("echoes", extra=["--name", "v1-again"], name="v1b", env={"INFERQ_TEST_SLOW_S": "0"})
        wait_until(lambda: status() == "finished", 90, "the retried job to finish")
        view = httpx.get(f"{stack.base}/v1/jobs/{job_id}", timeout=10).json()
        assert (view["version"], view["worker"], view["result"]) == (1, "v1-again", {"output": [4.0, 4.0]})


def _echo_model(folder: Path) -> None:
    folder.mkdir(parents=True)
    config = {
        "handler": "tests.support.echo:SlowEcho",
        "weights": "none",
        "input": {"kind": "tensor", "shape": [2], "dtype": "float32"},
    }
    (folder / "config.json").write_text(json.dumps(config))


def test_a_model_dropped_into_the_repository_is_served_without_restarting_the_api(tmp_path: Path) -> None:
    stack = new_stack(tmp_path, INFERQ_MODELS_POLL_S="0.5", INFERQ_TEST_SLOW_S="0")
    with serving(stack):
        stack.start_api()
        api = stack.procs[0]
        url = f"{stack.base}/v1/models/later/jobs"
        assert httpx.post(url, json={"inputs": [1, 1]}).status_code == 404
        _echo_model(stack.models_dir / "later")
        stack.start_worker("later", name="later")
        wait_until(lambda: httpx.post(url, json={"inputs": [1, 1]}).status_code == 202, 30, "the new model served")
        done = httpx.post(url, json={"inputs": [2, 2]}, headers={"Prefer": "wait=30"}, timeout=60).json()
        assert done["result"] == {"output": [2.0, 2.0]}
        assert api.poll() is None and stack.procs[0] is api  # the same API process throughout
        (stack.models_dir / "later" / "config.json").unlink()
        wait_until(lambda: httpx.post(url, json={"inputs": [1, 1]}).status_code == 404, 30, "the model removed")


def test_a_submit_naming_a_version_or_model_added_a_moment_ago_is_taken_before_the_next_look(tmp_path: Path) -> None:
    """A pinned submit to a version (or a model) the API does not know has it look at the repository at once: the
    README's rollout pins version 2 right after writing it, long before a slow poll would see it."""
    stack = new_stack(tmp_path, INFERQ_MODELS_POLL_S="3600", INFERQ_TEST_SLOW_S="0")
    _echo_model(stack.models_dir / "echoes")
    with serving(stack):
        stack.start_api()
        url = f"{stack.base}/v1/models/echoes/jobs"
        assert httpx.post(url, json={"inputs": [1, 1]}, params={"version": 2}).status_code == 404
        (stack.models_dir / "echoes" / "2").mkdir()
        (stack.models_dir / "echoes" / "1").mkdir()  # the folder's own (no weights) version 1 moves to 1/
        time.sleep(0.6)  # past the look the 404 above made (a look that finds nothing new waits 0.5 s for the next)
        pinned = httpx.post(url, json={"inputs": [1, 1]}, params={"version": 2})
        assert pinned.status_code == 202 and pinned.json()["version"] == 2, pinned.text
        _echo_model(stack.models_dir / "later")
        assert httpx.post(f"{stack.base}/v1/models/later/jobs", json={"inputs": [1, 1]}).status_code == 202


def test_inferq_models_reload_reads_the_repository_at_once(tmp_path: Path) -> None:
    stack = new_stack(tmp_path, INFERQ_MODELS_POLL_S="0")  # no watching: only when told
    with serving(stack):
        stack.start_api()
        _echo_model(stack.models_dir / "told")
        url = f"{stack.base}/v1/models/told/jobs"
        assert httpx.post(url, json={"inputs": [1, 1]}).status_code == 404
        cli = subprocess.run(
            [sys.executable, "-m", "inferq", "models", "reload", "--api", stack.base],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        assert "added    told" in cli.stdout
        assert httpx.post(url, json={"inputs": [1, 1]}).status_code == 202


def test_a_version_removed_from_the_repository_is_listed_as_draining_while_a_worker_still_serves_it(
    tmp_path: Path,
) -> None:
    """GET /v1/models keeps a removed version, as ``draining`` with no share, for as long as a worker is registered on
    its queue (``inferq up`` drains it: it serves what waits, then stops), and forgets it once none is and nothing
    waits; the status page says the same."""
    stack = new_stack(tmp_path, INFERQ_MODELS_POLL_S="0.2", INFERQ_TEST_SLOW_S="0")
    echo_versions(stack.models_dir, {"traffic": {"1": 50, "2": 50}})
    with serving(stack):
        stack.start_api()
        stack.start_worker("echoes", name="v1")
        two = stack.start_worker("echoes@2", name="v2")
        stack.wait_for_worker("echoes")
        stack.wait_for_worker("echoes@2")
        url = f"{stack.base}/v1/models/echoes"

        def versions() -> dict[int, dict[str, Any]]:
            return {v["version"]: v for v in httpx.get(url, timeout=10).json()["versions"]}

        assert {v: (s["state"], s["share"]) for v, s in versions().items()} == {1: ("ready", 50.0), 2: ("ready", 50.0)}
        shutil.rmtree(stack.models_dir / "echoes" / "2")
        wait_until(lambda: versions()[2]["state"] == "draining", 30, "version 2 listed as draining")
        listed = versions()
        assert (listed[1]["state"], listed[1]["share"]) == ("ready", 100.0)
        assert (listed[2]["share"], listed[2]["workers"], listed[2]["reason"]) == (
            0.0,
            1,
            "removed from the repository: its workers serve its queued jobs, then stop",
        )
        pinned = httpx.post(f"{url}/jobs", json={"inputs": [1, 1]}, params={"version": 2})
        assert pinned.status_code == 404, pinned.text  # it takes no new job
        status = {m["name"]: m for m in httpx.get(f"{stack.base}/v1/status", timeout=10).json()["models"]}
        assert (status["echoes@2"]["draining"], status["echoes"]["draining"]) == (True, False)
        two.send_signal(signal.SIGTERM)  # its worker ends (under inferq up: once drained)
        assert two.wait(timeout=30) == 0
        wait_until(lambda: set(versions()) == {1}, 30, "the drained version to leave the listing")
        status = {m["name"] for m in httpx.get(f"{stack.base}/v1/status", timeout=10).json()["models"]}
        assert "echoes" in status and "echoes@2" not in status
