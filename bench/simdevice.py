"""Devices for the benchmark that are not there: handlers that override only ``predict``.

Everything around the forward pass is the built-in handler's (``ImageClassifier``'s JPEG decode and normalise,
``TextClassifier``'s tokeniser, their collate and postprocess), as docs/serving.md promises a user's handler that
overrides only ``predict``; what the forward costs is set here:

- ``Instant…``: nothing. It answers at once, in the shape the model's own forward gives (read once, from one
  item through the real model, at the first batch: the worker's load-time checks), so what a worker spends per job
  is all host work: the queue's bookkeeping and the preprocessing that must feed a device.
- ``Simulated…``: a set time per item and no CPU, as a GPU is to the host: ``time.sleep`` releases the GIL, so the
  worker's other threads run meanwhile. The time comes from ``device.json`` in the model's folder,
  ``{"item_ms": 1.0}`` for a device of 1,000 items per second.

A model folder names one in its config: ``"handler": "bench.simdevice:InstantImageClassifier"`` (the worker runs
from the checkout's root, where ``bench`` imports).
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from inferq.workers.handlers import Handler, ImageClassifier
from inferq.workers.text import TextClassifier

DEVICE_FILE = "device.json"


def batch_size(batch: Any) -> int:
    """Items in a collated batch: a tensor's first axis, a dict of tensors' first value's."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    return int(batch.shape[0])


def first_item(batch: Any) -> Any:
    """The batch cut to its first item, in the same form."""
    if isinstance(batch, dict):
        return {key: value[:1] for key, value in batch.items()}
    return batch[:1]


class InstantDevice(Handler):
    """A handler's forward that costs nothing: outputs at once, of the shape and dtype the model's own forward gives
    one item (read from the real model at the first batch, then remembered)."""

    _output_tail: tuple[int, ...] | None = None
    _output_dtype: torch.dtype = torch.float32

    def predict(self, batch: Any) -> Any:
        if self._output_tail is None:
            real = super().predict(first_item(batch))
            self._output_tail, self._output_dtype = tuple(real.shape[1:]), real.dtype
        return torch.zeros((batch_size(batch), *self._output_tail), dtype=self._output_dtype)


class SimulatedDevice(InstantDevice):
    """A handler's forward that takes ``device.json``'s time per item and no CPU: ``time.sleep`` releases the GIL,
    as a GPU's forward leaves the host free."""

    _item_s: float | None = None

    def predict(self, batch: Any) -> Any:
        outputs = super().predict(batch)
        if self._item_s is None:
            spec = json.loads((self.config.weights_path.parent / DEVICE_FILE).read_text())
            self._item_s = float(spec["item_ms"]) / 1000.0
        time.sleep(self._item_s * batch_size(batch))
        return outputs


class InstantImageClassifier(InstantDevice, ImageClassifier):
    """The built-in image classifier on a device whose forward costs nothing."""


class InstantTextClassifier(InstantDevice, TextClassifier):
    """The built-in text classifier on a device whose forward costs nothing."""


class SimulatedImageClassifier(SimulatedDevice, ImageClassifier):
    """The built-in image classifier on a device of ``device.json``'s time per item."""
