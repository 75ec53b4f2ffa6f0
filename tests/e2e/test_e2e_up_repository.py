"""`inferq up` while its model repository changes under it: a serving model's config that turns invalid, and a
removed version's draining worker killed with jobs left in its queues."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.up import up_serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(600)
TENSOR = {"kind": "tensor", "shape": [2], "dtype": "float32"}
MODELS = {
    # A serving model whose config.json gets a typo.
    "keep": {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": TENSOR},
    # Removed by its config alone: a drainer started with the config it served can load it again.
    "gone": {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": TENSOR, "max_batch": 1},
    # Removed with its weights: no worker can load it any more.
    "lost": {"handler": "tests.support.echo:Weighed", "weights": "w.bin", "input": TENSOR, "max_batch": 1},
}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    tmp = tmp_path_factory.mktemp("up-repository")
    models = tmp / "models"
    for name, config in MODELS.items():
        (models / name).mkdir(parents=True)
        (models / name / "config.json").write_text(json.dumps(config))
    (models / "lost" / "w.bin").write_bytes(b"weights")
    settings = {
        "INFERQ_MODELS_DIR": str(models),
        "INFERQ_MODELS_POLL_S": "0.5",
        "INFERQ_TEST_SLOW_S": "1",
        # A killed worker's running job is given back within seconds, not the default half-minute.
        "INFERQ_HEARTBEAT_TTL_S": "4",
        "INFERQ_MAINTENANCE_INTERVAL_S": "2",
    }
    with up_serving(tmp, 120, **settings) as (proc, base, _):
        try:
            wait_until(lambda: _workers(base) == {"gone": 1, "keep": 1, "lost": 1}, 180, "a worker per model")
            yield proc, base, models
        except BaseException:
            print((tmp / "up.log").read_text())
            raise


def _workers(base: str) -> dict[str, int]:
    return {m["name"]: m["workers"] for m in httpx.get(f"{base}/v1/models", timeout=10).json()["models"]}


def _log(models: Path) -> str:
    return (models.parent / "up.log").read_text()


def _children_with(parent: int, fragment: str) -> list[int]:
    out = subprocess.run(["ps", "-ww", "-o", "pid,args", "--ppid", str(parent)], capture_output=True, text=True)
    return [int(line.split()[0]) for line in out.stdout.splitlines()[1:] if line.rstrip().endswith(fragment)]


def _submit(base: str, model: str, value: float, wait: bool = False) -> httpx.Response:
    headers = {"Prefer": "wait=30"} if wait else {}
    return httpx.post(f"{base}/v1/models/{model}/jobs", json={"inputs": [value, value]}, headers=headers, timeout=60)


def _view(base: str, job_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{base}/v1/jobs/{job_id}", timeout=10).json())


def test_a_serving_models_config_turned_invalid_keeps_its_worker_and_serves_on(
    up: tuple[subprocess.Popen[bytes], str, Path],
) -> None:
    """A trailing comma stood 6 s in the audit: the supervisor drained and stopped the serving worker, and 21 of 24
    submits answered 404, against docs/models.md's "the version never stands without a worker"."""
    proc, base, models = up
    config = models / "keep" / "config.json"
    good = config.read_text()
    (worker,) = _children_with(proc.pid, "worker --model keep")
    config.write_text(good.replace("}}", "},}"))
    said = "worker keep: its config is invalid now ("
    wait_until(lambda: said in _log(models), 30, "the supervisor to say the config is invalid")

    def invalid() -> list[dict[str, Any]]:
        return list(httpx.get(f"{base}/v1/models", timeout=10).json()["invalid"])

    wait_until(lambda: [(i["name"], i["serving"]) for i in invalid()] == [("keep", True)], 30, "the API to say so")
    for n in range(5):
        done = _submit(base, "keep", float(n), wait=True)
        assert done.status_code == 200 and done.json()["result"] == {"output": [n, n]}, done.text
    assert _children_with(proc.pid, "worker --model keep") == [worker]
    config.write_text(good)
    wait_until(lambda: "worker keep: its config is valid again" in _log(models), 30, "the fixed config")
    wait_until(lambda: invalid() == [], 30, "the API to read the fixed config")
    assert _children_with(proc.pid, "worker --model keep") == [worker]
    assert "worker keep: its model left the repository" not in _log(models)
    assert _log(models).count(said) == 1


def test_a_draining_worker_killed_with_jobs_left_is_followed_by_a_drainer_until_every_job_ended(
    up: tuple[subprocess.Popen[bytes], str, Path],
) -> None:
    """The audit's kill -9 of version 2's draining worker: 1 job started and 10 queued stayed so, with no worker,
    and GET /v1/models said its workers served them."""
    proc, base, models = up
    queued = {model: [_submit(base, model, float(n)).json()["id"] for n in range(10)] for model in ("gone", "lost")}
    workers = {model: _children_with(proc.pid, f"worker --model {model}") for model in queued}
    (models / "gone" / "config.json").unlink()  # its weights ("none") stay: a drainer can load it
    shutil.rmtree(models / "lost")  # its weights go with it
    for model in queued:
        said = f"worker {model}: its model left the repository; it serves its queued jobs, then stops"
        wait_until(lambda said=said: said in _log(models), 30, f"{model}'s worker to drain")
    for (pid,) in workers.values():
        os.kill(pid, signal.SIGKILL)

    def ended(model: str) -> list[dict[str, Any]]:
        views = [_view(base, job_id) for job_id in queued[model]]
        return views if all(v["status"] in ("finished", "failed") for v in views) else []

    wait_until(lambda: bool(ended("gone")) and bool(ended("lost")), 180, "every job of both to end")
    assert [v["status"] for v in ended("gone")] == ["finished"] * 10  # served by the drainer, with its config
    lost = ended("lost")
    failed = [v for v in lost if v["status"] == "failed"]
    assert failed, lost  # some were left when its worker was killed
    weights = models / "lost" / "w.bin"
    reason = (
        "version 1 of model 'lost' left the repository before this job ran, and no worker can load it any more: "
        f"model 'lost': loading {weights} failed: FileNotFoundError: [Errno 2] No such file or directory: '{weights}'"
    )
    assert {v["error"] for v in failed} == {reason}, failed
    for model in queued:
        wait_until(lambda model=model: not _children_with(proc.pid, f"worker --model {model} --drain"), 60, "drainers")
        wait_until(lambda model=model: f"worker {model}: drained and stopped" in _log(models), 30, "their end")
        restarted = re.findall(
            rf"worker {model} was killed by SIGKILL while draining, with (\d+) job\(s\) left in its queues; a worker "
            r"starts in 0 s to serve them, then stops",
            _log(models),
        )
        assert len(restarted) == 1 and int(restarted[0]) > 0, _log(models)
    wait_until(lambda: set(_workers(base)) == {"keep"}, 60, "both to leave the listing")
