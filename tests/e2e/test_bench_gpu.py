"""bench/gpu.py, the script a lent GPU's few minutes run: it must work the first time, so it is run here too.

Without CUDA it refuses (it never substitutes CPU figures); its ``--dry-run`` runs its checks on the CPU, and
the table it prints reads the JSON it wrote, such as the H200 run's, kept beside its page.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import gpu
from tests.support.models import ROOT

RUN = ROOT / "docs" / "performance" / "2026-11-27-gpu-h200.json"


# The dry run compiles both demos with torch.compile on the CPU: about a minute on 2 idle cores, several on a busy
# machine; the suite's default timeout (120 s) would stop the whole session.
DRY_RUN_S = 480


def _bench_gpu(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bench.gpu", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DRY_RUN_S, check=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_refuses_rather_than_measure_the_cpu(tmp_path: Path) -> None:
    done = _bench_gpu("--out", str(tmp_path))
    assert done.returncode == 2
    assert "never substitutes CPU figures" in done.stderr
    assert not (tmp_path / "gpu.json").exists()


@pytest.mark.timeout(DRY_RUN_S + 60)
def test_a_dry_run_checks_labels_and_devices_on_the_cpu(tmp_path: Path) -> None:
    done = _bench_gpu("--dry-run", "--out", str(tmp_path), "--only", "labels,oom,devices")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "gpu.json").read_text())
    assert results["errors"] == {}
    labels = results["labels"]
    assert set(labels) == {
        f"{m} {v}" for m in ("digits", "langid") for v in ("float32", "float16", "bfloat16", "compile")
    }
    for name, point in labels.items():
        assert point["inputs"] > 0 and point["same_top1_as_float32"] == point["inputs"], name
    assert "skipped" in results["oom"]  # 256 GiB of host memory is not asked for on the CPU
    devices = results["devices"]
    assert devices["cpu"]["exit"] == 0
    assert devices["cuda:0"] == {"exit": 78, "last_line": "inferq: device 'cuda:0' requested but CUDA is not available"}
    assert (tmp_path / "gpu.md").read_text().count("as float32") == 8


def test_the_table_reads_the_h200_run() -> None:
    text = gpu.table(json.loads(RUN.read_text()))
    assert text.startswith("GPU: NVIDIA H200")
    assert "- oom: ran 256/256, failed 0, max_batch 256 -> 128" in text
    assert "- 4 worker process(es): 1215/s" in text
    assert "ERROR" not in text


def test_top1_reads_a_classifier_answer() -> None:
    assert gpu.top1({"label": "7", "score": 0.9, "top_k": [{"label": "7", "score": 0.9}]}) == "7"
    assert gpu.top1([1.0, 2.0]) == "[1.0, 2.0]"
