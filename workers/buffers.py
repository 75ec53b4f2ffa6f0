"""Reused batch buffers: a built-in image handler's batch is written in place, no per-image array, no new batch.

Preprocessing an image as ``ImageClassifier.preprocess`` does, then stacking the images, made a new 602 KB float
array per 224x224 image and a new 38.5 MB tensor per batch of 64: most of that time was the kernel's page faults
on memory just allocated (issue 46). Here the handler decodes each image to its pixels (uint8, channel-first) and
normalises them straight into row i of a batch tensor leased from ``BatchBuffers``: the same arithmetic, the same
values, into memory touched once and kept. A buffer is pinned on a CUDA device (the copy to the GPU reads it) and
laid out channels-last for a model that runs so (``running.choose_layout``), so the batch needs no copy either.

A lease lasts one batch: the worker gives it back once the batch ran (its outputs are on the CPU by then, so the
copy to the device is done), and the next batch written into it cannot touch one still in use. Only the built-ins
run so (``filler``): a handler that overrides ``preprocess`` or ``collate`` gets its own, as docs/serving.md says.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from inferq.workers.collation import to_device
from inferq.workers.handlers import Handler, ImageClassifier

if TYPE_CHECKING:
    from inferq.workers.running import Item, ModelRunner

# Buffers kept per shape: the batch running, the one prepared beside it (INFERQ_OVERLAP), one more being prepared.
KEEP = 3

_Key = tuple[tuple[int, ...], bool, bool]  # shape, channels-last, pinned


@dataclass(eq=False)
class Lease:
    """One batch's buffer, given back to its ``BatchBuffers`` once the batch ran."""

    owner: BatchBuffers
    key: _Key
    tensor: torch.Tensor
    returned: bool = False

    def give_back(self) -> None:
        if not self.returned:
            self.returned = True
            self.owner.take_back(self)


class BatchBuffers:
    """Float32 batch tensors kept for reuse, by shape and layout; thread-safe (the prefetch thread prepares too)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.made = 0  # buffers allocated: what reuse saves shows here
        self._free: dict[_Key, list[torch.Tensor]] = defaultdict(list)
        self._lock = threading.Lock()

    def lease(self, shape: tuple[int, ...], *, channels_last: bool, pinned: bool) -> Lease:
        key = (shape, channels_last, pinned)
        with self._lock:
            free = self._free[key]
            if free:
                return Lease(self, key, free.pop())
            self.made += 1
        layout = torch.channels_last if channels_last and len(shape) == 4 else torch.contiguous_format
        tensor = torch.empty(shape, dtype=torch.float32, memory_format=layout, pin_memory=pinned)
        return Lease(self, key, tensor)

    def take_back(self, lease: Lease) -> None:
        with self._lock:
            free = self._free[lease.key]
            if len(free) < self.keep:
                free.append(lease.tensor)


def filler(handler: Handler) -> ImageClassifier | None:
    """The handler when its batches are written in place: an image handler whose preprocess and collate are the
    built-ins (one that overrides only ``predict`` or ``postprocess`` included); else None."""
    if not isinstance(handler, ImageClassifier):
        return None
    kind = type(handler)
    built_in = kind.preprocess is ImageClassifier.preprocess and kind.pixels is ImageClassifier.pixels
    built_in = built_in and kind.normalise_into is ImageClassifier.normalise_into
    return handler if built_in and kind.collate is Handler.collate else None


class Filling:
    """A batch being written in place: each image's pixels normalised into the next row of a buffer the runner
    leases (as large as its batch ceiling, laid out as its model runs), as soon as it is decoded, so the decoded
    image's memory serves the next one. Its groups are the buffers' filled rows: the runner's plan for images
    (runs of at most the ceiling, in order). An item's value becomes its row, so a batch split to find a bad item
    collates again as ``Handler.collate`` does."""

    def __init__(self, handler: ImageClassifier, runner: ModelRunner) -> None:
        self.handler = handler
        self.runner = runner
        self.leases: list[Lease] = []
        self._groups: list[tuple[list[Item], torch.Tensor]] = []
        self._group: list[Item] = []
        self._rows: torch.Tensor | None = None
        self._out: np.ndarray | None = None

    def add(self, item: Item, payload: bytes) -> None:
        """Decode ``item``'s image (``payload``) and normalise it into the next row; an error (the client's image)
        leaves the row to the next item."""
        pixels = self.handler.pixels(payload, item.content_type)
        rows, out = self._rows, self._out
        if rows is None or out is None or len(self._group) == len(rows) or tuple(rows.shape[1:]) != pixels.shape:
            self._close()
            capacity = max(1, self.runner.max_batch)
            pinned = self.handler.device.type == "cuda"
            lease = self.runner.buffers.lease(
                (capacity, *pixels.shape), channels_last=self.runner.channels_last, pinned=pinned
            )
            self.leases.append(lease)
            rows = self._rows = lease.tensor
            out = self._out = rows.numpy()
        n = len(self._group)
        self.handler.normalise_into(pixels, out[n])
        item.value = rows[n]
        self._group.append(item)

    def groups(self) -> list[tuple[list[Item], torch.Tensor]]:
        """Each group and its rows (on the CPU; ``to_device`` moves them)."""
        self._close()
        return self._groups

    def to_device(self, rows: torch.Tensor) -> Any:
        return to_device(rows, self.handler.device, self.handler.dtype)

    def _close(self) -> None:
        if self._group and self._rows is not None:
            self._groups.append((self._group, self._rows[: len(self._group)]))
        self._group = []
