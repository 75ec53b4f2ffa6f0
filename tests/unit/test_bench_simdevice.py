"""The benchmark's simulated devices (bench/simdevice.py): handlers that override only ``predict``, answering in
the built-in's shape, at once or after a set time that leaves the GIL to the worker's other threads."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from bench import simdevice
from bench.models import ROOT
from inferq.shared.models import load_model_config
from inferq.workers.handlers import Handler, load_handler

DIGITS = ROOT / "models" / "digits"
LANGID = ROOT / "models" / "langid"


def _pngs(count: int) -> list[tuple[bytes, str]]:
    from bench.run import payloads_for

    pngs, content_type = payloads_for("digits", count)
    return [(png, content_type) for png in pngs]


def _folder(tmp_path: Path, source: Path, handler: str, item_ms: float | None = None) -> Path:
    folder = tmp_path / source.name
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.py"))
    config = json.loads((folder / "config.json").read_text()) | {"handler": handler, "device": "cpu"}
    (folder / "config.json").write_text(json.dumps(config))
    if item_ms is not None:
        (folder / simdevice.DEVICE_FILE).write_text(json.dumps({"item_ms": item_ms}))
    return folder


def _loaded(folder: Path) -> Handler:
    handler = load_handler(load_model_config(folder), torch.device("cpu"))
    handler.load()
    return handler


def _outputs(handler: Handler, payloads: list[tuple[bytes, str]]) -> tuple[torch.Tensor, list[Any]]:
    items = [handler.preprocess(payload, content_type) for payload, content_type in payloads]
    with torch.inference_mode():
        outputs = handler.predict(handler.collate(items))
    return outputs, [handler.postprocess(row) for row in handler.uncollate(outputs, len(items))]


def test_the_instant_image_handler_answers_in_the_built_ins_shape_with_its_preprocessing(tmp_path: Path) -> None:
    builtin = _loaded(DIGITS)
    instant = _loaded(_folder(tmp_path, DIGITS, "bench.simdevice:InstantImageClassifier"))
    assert type(instant).preprocess is type(builtin).preprocess  # only predict is its own
    for count in (3, 1, 7):  # its first batch taught it the shape; later ones of any size keep it
        real, real_results = _outputs(builtin, _pngs(count))
        fake, fake_results = _outputs(instant, _pngs(count))
        assert (fake.shape, fake.dtype) == (real.shape, real.dtype) == (torch.Size([count, 10]), torch.float32)
        assert [sorted(r) for r in fake_results] == [sorted(r) for r in real_results]
        assert [len(r["top_k"]) for r in fake_results] == [3] * count


def test_the_instant_text_handler_answers_in_the_built_ins_shape(tmp_path: Path) -> None:
    texts = [(b"Der Hund schlaeft im Garten.", "text/plain"), (b"Le chat dort.", "text/plain")]
    builtin = _loaded(LANGID)
    instant = _loaded(_folder(tmp_path, LANGID, "bench.simdevice:InstantTextClassifier"))
    real, real_results = _outputs(builtin, texts)
    fake, fake_results = _outputs(instant, texts)
    assert (fake.shape, fake.dtype) == (real.shape, real.dtype)
    assert [sorted(r) for r in fake_results] == [sorted(r) for r in real_results] == [["label", "score", "top_k"]] * 2


def test_the_simulated_device_sleeps_its_time_per_item_with_the_gil_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread runs while predict sleeps: it is let go just as the sleep begins, and with a switch interval
    of minutes it can only take the GIL if the sleep gives it up (a spin in its place shows the check can fail)."""
    handler = _loaded(_folder(tmp_path, DIGITS, "bench.simdevice:SimulatedImageClassifier", item_ms=5.0))
    items = [handler.preprocess(png, content_type) for png, content_type in _pngs(4)]
    batch = handler.collate(items)
    with torch.inference_mode():
        handler.predict(batch[:1])  # its first batch runs the real model once: not what is watched here

    def watched(wait: Any) -> tuple[bool, list[float]]:
        gate, ran = threading.Event(), threading.Event()
        asked: list[float] = []

        def sleep(seconds: float) -> None:
            asked.append(seconds)
            gate.set()
            wait(seconds)

        def other() -> None:
            gate.wait()
            ran.set()

        monkeypatch.setattr(simdevice, "time", SimpleNamespace(sleep=sleep))
        helper = threading.Thread(target=other, daemon=True)
        helper.start()
        interval = sys.getswitchinterval()
        sys.setswitchinterval(300.0)
        try:
            with torch.inference_mode():
                outputs = handler.predict(batch)
            seen = ran.is_set()  # read before anything else can give up the GIL
        finally:
            sys.setswitchinterval(interval)
            gate.set()
            helper.join()
        assert outputs.shape == (4, 10)
        return seen, asked

    def spin(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    assert watched(time.sleep) == (True, [pytest.approx(0.020)])  # 4 items at 5 ms each
    assert watched(spin) == (False, [pytest.approx(0.020)])
