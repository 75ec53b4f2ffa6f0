"""The feed's model folders and what its submits send (``bench.feed``): every model at max batch 64, on the
devices of ``bench.simdevice``; a digit PNG, a langid text, a 34 KB 224x224 JPEG, a no-op tensor."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

MAX_BATCH = 64
JPEG_BYTES = 34_000  # the JPEG: 224x224, about 34 KB
SIM_RATES = {"sim1000": 1000, "sim2000": 2000}  # simulated devices, images per second


def feed_models(target: Path, base: dict[str, Path]) -> Path:
    """The scenarios' model folders under ``target`` (a repository the API and the workers read), from
    ``bench.models``' folders: every model at max batch 64, the CNN's weights linked, not copied."""
    target.mkdir(parents=True, exist_ok=True)

    def folder(name: str, source: Path, **changes: Any) -> Path:
        out = target / name
        out.mkdir(exist_ok=True)
        for entry in source.iterdir():
            if entry.name != "config.json" and not (out / entry.name).exists():
                (out / entry.name).symlink_to(entry.resolve())
        config = json.loads((source / "config.json").read_text()) | {"max_batch": MAX_BATCH} | changes
        (out / "config.json").write_text(json.dumps(config, indent=2))
        return out

    folder("noop", base["noop"])
    folder("digits", base["digits"])
    folder("langid", base["langid"], handler="bench.simdevice:InstantTextClassifier")
    # Contiguous, unfused: on a GPU the worker keeps the layout as loaded and fuses nothing (workers/running.py),
    # and a forward that costs nothing would make the CPU's timed choice between them a coin toss.
    image = {"memory_format": "contiguous", "fuse": "off"}
    folder("cnn", base["resnet"], handler="bench.simdevice:InstantImageClassifier", **image)
    for name, per_s in SIM_RATES.items():
        sim = folder(name, base["resnet"], handler="bench.simdevice:SimulatedImageClassifier", **image)
        (sim / "device.json").write_text(json.dumps({"item_ms": 1000 / per_s}))
    return target


def jpeg_of_about(size_bytes: int) -> bytes:
    """Of ``bench.run``'s 224x224 JPEGs, the one nearest ``size_bytes``."""
    from bench.run import payloads_for

    jpegs, _ = payloads_for("resnet", 8)
    return min(jpegs, key=lambda jpeg: abs(len(jpeg) - size_bytes))


def a_langid_text() -> str:
    """A text of the median length of ``bench.vs_litserve``'s corpus (langid's languages, realistic lengths)."""
    from bench.vs_litserve import texts

    corpus = sorted(texts(101), key=len)
    return corpus[len(corpus) // 2]


@cache
def payload(kind: str) -> tuple[bytes, str]:
    """What each submit of a scenario sends, and its content type."""
    from bench.run import payloads_for

    if kind == "png":
        return payloads_for("digits", 1)[0][0], "image/png"
    if kind == "text":
        return a_langid_text().encode(), "text/plain; charset=utf-8"
    if kind == "jpeg":
        return jpeg_of_about(JPEG_BYTES), "image/jpeg"
    return payloads_for("noop", 1)[0][0], "application/json"
