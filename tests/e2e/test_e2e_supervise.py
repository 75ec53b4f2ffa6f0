"""`inferq up` with models that cannot serve: each is named and left out (a crashing one is restarted, backing off),
and the rest keep serving."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from inferq.shared.redis_server import free_port
from tests.support.models import ROOT
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
TENSOR = {"kind": "tensor", "shape": [2], "dtype": "float32"}


def _write(models: Path, name: str, config: dict[str, object]) -> None:
    (models / name).mkdir(parents=True)
    (models / name / "config.json").write_text(json.dumps(config))


def test_a_broken_model_a_crashing_worker_and_an_invalid_config_leave_the_rest_serving(tmp_path: Path) -> None:
    models = tmp_path / "models"
    _write(models, "slow", {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": TENSOR})
    # Its config is fine, its weights are missing: the worker exits 78 at start.
    _write(models, "broken", {"format": "export", "weights": "gone.pt2", "input": TENSOR, "handler": "tensor"})
    # Its worker dies while loading, every time.
    _write(models, "crashy", {"handler": "tests.support.crashing:Crash", "weights": "none", "input": TENSOR})
    # Its config.json fails validation: no "input".
    _write(models, "invalid", {"handler": "tensor", "weights": "model.pt"})
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")} | {
        "INFERQ_PORT": str(port),
        "INFERQ_DATA_DIR": str(tmp_path / "state"),
        "INFERQ_MODELS_DIR": str(models),
        "PYTHONPATH": str(ROOT),
    }
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferq", "up"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    backing_off = "worker crashy exited 5 times within 60 s (last status 3); restarting it in 8 s"
    try:
        wait_until(lambda: backing_off in log_path.read_text(), 150, "the crash loop to back off")
        ready = httpx.get(f"{base}/readyz", timeout=10)
        assert ready.status_code == 200
        assert ready.json() == {
            "status": "degraded",
            "workers": {"broken": 0, "crashy": 0, "slow": 1},
            "models_without_workers": ["broken", "crashy"],
            "invalid_models": ["invalid"],
            "durability": "async",
            "replicas": None,
            "unavailable": {},
        }
        listing = httpx.get(f"{base}/v1/models", timeout=10).json()
        assert [(m["name"], m["workers"]) for m in listing["models"]] == [("broken", 0), ("crashy", 0), ("slow", 1)]
        config_file = models / "invalid" / "config.json"
        assert listing["invalid"] == [
            {"name": "invalid", "error": f"{config_file}: input: Field required", "serving": False}
        ]
        done = httpx.post(
            f"{base}/v1/models/slow/jobs", json={"inputs": [1, 2]}, headers={"Prefer": "wait=30"}, timeout=40
        )
        assert done.status_code == 200 and done.json()["result"] == {"output": [1.0, 2.0]}, done.text
        refused = httpx.post(f"{base}/v1/models/invalid/jobs", json={"inputs": [1, 2]}, timeout=10)
        assert refused.status_code == 404
        assert refused.json()["error"]["message"] == (
            f"model 'invalid' is not served: its config is invalid: {config_file}: input: Field required"
        )
        shown = subprocess.run(
            [sys.executable, "-m", "inferq", "models", "--api", base], capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0, shown.stderr
        assert re.search(r"^slow .* workers=1$", shown.stdout, re.M), shown.stdout
        assert re.search(r"^broken .* workers=0$", shown.stdout, re.M), shown.stdout
        assert f"invalid              not served: {config_file}: input: Field required" in shown.stdout
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 0
    except BaseException:
        print(log_path.read_text())
        raise
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    output = log_path.read_text()
    assert "Traceback" not in output
    # Each is said once: the broken model's own reason, that its worker is not restarted, the invalid config.
    missing = f"inferq: model 'broken': weights file {models / 'broken' / 'gone.pt2'} does not exist"
    assert output.count(missing) == 1
    assert output.count("worker broken could not start (its error is above); not restarting it") == 1
    assert output.count("model invalid is left out, its config is invalid: ") == 1
    assert f"left out: invalid: {config_file}: input: Field required" in output  # in the banner
    # Never given up: backed off (0 s, 1 s, 2 s, 4 s, 8 s...), and said so at each exit.
    assert output.count("worker crashy exited with status 3; restarting it in ") == 2
    assert "worker crashy exited 3 times within 60 s (last status 3); restarting it in 2 s" in output
    assert "not restarting it" not in output.replace(
        "worker broken could not start (its error is above); not restarting it", ""
    )
