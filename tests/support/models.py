"""Model repositories for tests: the project's demo models, and folders of model configs written on the spot."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def train_script(model: str) -> ModuleType:
    """A demo model's models/<model>/train.py, imported by path (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location(f"{model}_train", ROOT / "models" / model / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_models_dir(target: Path) -> Path:
    """A model repository for tests: the real digits model under three names, and a tensor model."""
    target.mkdir(parents=True, exist_ok=True)
    digits = ROOT / "models" / "digits"
    for name in ("digits", "digits-batch"):
        folder = target / name
        folder.mkdir()
        shutil.copy(digits / "model.pt2", folder / "model.pt2")
        shutil.copy(digits / "config.json", folder / "config.json")
    for name, retries in (("slow", None), ("fragile", 0)):
        folder = target / name
        folder.mkdir()
        config = {
            "handler": "tests.support.echo:SlowEcho",
            "weights": "none",
            "input": {"kind": "tensor", "shape": [2], "dtype": "float32"},
            "max_batch": 8,
            "retries": retries,
        }
        (folder / "config.json").write_text(json.dumps(config))
    return target


def write_models(root: Path, configs: dict[str, dict[str, Any]]) -> Path:
    for name, config in configs.items():
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text(json.dumps(config))
    return root
