"""A model whose config or weights are bad stops `inferq worker` at once with one readable line (a real process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.builders import IMAGE_INPUT, write_config
from tests.support.models import ROOT


def _run_cli(args: list[str], models_dir: Path, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INFERQ_MODELS_DIR": str(models_dir), "INFERQ_REDIS_URL": redis_url}
    return subprocess.run(
        [sys.executable, "-m", "inferq", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_inferq_worker_exits_at_once_with_one_line(tmp_path: Path, redis_url: str) -> None:
    # `inferq up` leaves such a model out and serves the rest: tests/e2e/test_e2e_supervise.py.
    models = tmp_path / "models"
    write_config(models / "broken", handler="image_classifier", format="export", weights="gone.pt2", input=IMAGE_INPUT)
    done = _run_cli(["worker", "--model", "broken", "--burst"], models, redis_url)
    assert done.returncode == 78
    assert done.stderr.strip().splitlines()[-1] == (
        f"inferq: model 'broken': weights file {models / 'broken' / 'gone.pt2'} does not exist"
    )
    assert "Traceback" not in done.stderr
