"""Image handlers and inputs for the tests of batches written in place (workers.buffers) and of the feeders
(workers.feeders): a handler that overrides only ``load`` and ``predict``, one with its own ``preprocess``, random
RGB images, items and runners."""

from __future__ import annotations

from io import BytesIO
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import torch
from PIL import Image

from inferq.shared.models import load_model_config
from inferq.workers.handlers import ImageClassifier
from inferq.workers.running import Item, ModelRunner, load_runner
from tests.support.builders import write_config

CPU = torch.device("cpu")
RGB_INPUT = {"kind": "image", "mode": "RGB", "size": [16, 12], "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3]}
POISON = 255  # an all-white image: the model below fails on any batch holding one


class Sums(ImageClassifier):
    """An image handler overriding only load and predict (as docs/serving.md's users do): each image's channel
    sums, recording every batch the model saw; a batch holding an all-white image fails."""

    def load(self) -> None:
        self.seen: list[torch.Tensor] = []
        self.model = None

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        self.seen.append(batch.clone())
        if bool((batch[:, 0].amin(dim=(1, 2)) == batch.new_tensor(self._white)).any()):
            raise RuntimeError("a white image")
        return batch.flatten(2).sum(-1)

    @property
    def _white(self) -> float:
        return float(np.float32(POISON) * self._scale[0, 0, 0] + self._shift[0, 0, 0])


class OwnPreprocess(Sums):
    """Its own preprocess: the batch is its items stacked, as before."""

    def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
        return super().preprocess(payload, content_type) * 2


def image(seed: int, size: tuple[int, int] = (20, 15), fmt: str = "JPEG", white: bool = False) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buffer = BytesIO()
    Image.fromarray(np.full_like(pixels, POISON) if white else pixels, mode="RGB").save(buffer, format=fmt)
    return buffer.getvalue()


def items(payloads: list[bytes], content_type: str = "image/jpeg") -> list[Item]:
    return [Item(cast(Any, SimpleNamespace(id=f"job-{n}")), p, content_type) for n, p in enumerate(payloads)]


def runner(tmp_path: Path, handler: type[Sums] = Sums, max_batch: int = 8) -> ModelRunner:
    spec = f"{__name__}:{handler.__name__}"
    folder = write_config(tmp_path / "m", handler=spec, weights="none", input=RGB_INPUT, max_batch=max_batch)
    return load_runner(load_model_config(folder), CPU, max_batch)
