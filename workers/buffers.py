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

import contextlib
import logging
import math
import threading
from collections import defaultdict
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from inferq.workers.collation import to_device
from inferq.workers.handlers import Handler, ImageClassifier

if TYPE_CHECKING:
    from inferq.workers.running import Item, ModelRunner

log = logging.getLogger(__name__)

# Buffers kept per shape: the batch running, the one prepared beside it (INFERQ_OVERLAP), one more being prepared.
KEEP = 3

_Key = tuple[tuple[int, ...], bool, bool, bool]  # shape, channels-last, pinned, shared with the feeders


@dataclass(frozen=True)
class Buffer:
    """A batch tensor, and the shared memory segment it lives in when the feeders write it (``workers.feeders``)."""

    tensor: torch.Tensor
    segment: str | None = None  # the segment's name: a feeder attaches it by name
    shape: tuple[int, ...] = ()
    channels_last: bool = False


@dataclass(eq=False)
class Lease:
    """One batch's buffer, given back to its ``BatchBuffers`` once the batch ran."""

    owner: BatchBuffers
    key: _Key
    buffer: Buffer
    returned: bool = False

    @property
    def tensor(self) -> torch.Tensor:
        return self.buffer.tensor

    def give_back(self) -> None:
        if not self.returned:
            self.returned = True
            self.owner.take_back(self)


class BatchBuffers:
    """Float32 batch tensors kept for reuse, by shape and layout; thread-safe (the prefetch thread prepares too).

    A shared one (for the feeders) is never dropped while the worker runs: a feeder holds it mapped by name, and at
    most ``keep`` of a shape are ever leased at once (the batch running, the next, one being prepared)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.made = 0  # buffers allocated: what reuse saves shows here
        self._free: dict[_Key, list[Buffer]] = defaultdict(list)
        self._segments: list[shared_memory.SharedMemory] = []
        self._lock = threading.Lock()

    def lease(self, shape: tuple[int, ...], *, channels_last: bool, pinned: bool, shared: bool = False) -> Lease:
        key = (shape, channels_last, pinned, shared)
        with self._lock:
            free = self._free[key]
            if free:
                return Lease(self, key, free.pop())
            self.made += 1
        if shared:
            buffer = self._shared(shape, channels_last, pinned)
        else:
            layout = torch.channels_last if channels_last and len(shape) == 4 else torch.contiguous_format
            buffer = Buffer(torch.empty(shape, dtype=torch.float32, memory_format=layout, pin_memory=pinned))
        return Lease(self, key, buffer)

    def take_back(self, lease: Lease) -> None:
        with self._lock:
            free = self._free[lease.key]
            if len(free) < self.keep or lease.buffer.segment is not None:
                free.append(lease.buffer)

    def close(self) -> None:
        """Unlink the shared segments (the worker's end; its resource tracker does it after a kill)."""
        with self._lock:
            segments, self._segments = self._segments, []
            self._free.clear()
        for segment in segments:
            with contextlib.suppress(BufferError):  # a tensor still maps it: the mapping goes with the process
                segment.close()
            segment.unlink()

    def _shared(self, shape: tuple[int, ...], channels_last: bool, pinned: bool) -> Buffer:
        segment = shared_memory.SharedMemory(create=True, size=max(1, math.prod(shape)) * 4)
        with self._lock:
            self._segments.append(segment)
        tensor = torch.from_numpy(shared_rows(segment.buf, shape, channels_last))
        if channels_last and len(shape) == 4:
            tensor = tensor.permute(0, 3, 1, 2)  # N x C x H x W over memory laid out N x H x W x C
        if pinned:
            _register(tensor)
        return Buffer(tensor, segment.name, shape, channels_last)


def shared_rows(memory: Any, shape: tuple[int, ...], channels_last: bool) -> np.ndarray:
    """A shared segment as the batch's float32 array: N x C x H x W, or N x H x W x C for channels-last."""
    stored = (shape[0], *shape[2:], shape[1]) if channels_last and len(shape) == 4 else shape
    return np.ndarray(stored, dtype=np.float32, buffer=memory)


def row_view(rows: np.ndarray, n: int, channels_last: bool) -> np.ndarray:
    """Row ``n`` of ``shared_rows`` as channel-first pixels are written into it."""
    return rows[n].transpose(2, 0, 1) if channels_last and rows.ndim == 4 else rows[n]


def _register(tensor: torch.Tensor) -> None:
    """Page-lock a shared buffer for the copy to the GPU (cudaHostRegister), as ``pin_memory`` would allocate it; a
    refusal leaves it pageable (the copy then goes through a pinned staging copy)."""
    try:
        code = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), tensor.untyped_storage().nbytes(), 0)
    except Exception as exc:
        log.warning("could not page-lock a shared batch buffer (%s): its copies to the GPU are staged", exc)
        return
    if int(code) != 0:
        log.warning("could not page-lock a shared batch buffer (cudaHostRegister: %s): its copies are staged", code)


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
    leases (as large as its batch ceiling, laid out as its model runs). Its groups are the buffers' filled rows: the
    runner's plan for images (runs of at most the ceiling, in order). An item's value becomes its row, so a batch
    split to find a bad item collates again as ``Handler.collate`` does.

    In the worker's process, each image is normalised as soon as it is decoded (the decoded image's memory serves
    the next one). With feeders (``workers.feeders``), the buffers are shared and the rows are filled by the feeders
    at once when the groups are asked for; a row that failed there is closed up, the rows after it moved down."""

    def __init__(self, handler: ImageClassifier, runner: ModelRunner) -> None:
        self.handler = handler
        self.runner = runner
        self.feeders = runner.feeders
        self.leases: list[Lease] = []
        self._groups: list[tuple[list[Item], Lease]] = []
        self._group: list[Item] = []
        self._lease: Lease | None = None
        self._sent: list[tuple[Item, Lease, int, bytes]] = []  # rows for the feeders

    def add(self, item: Item, payload: bytes) -> None:
        """Decode ``item``'s image (``payload``) into the next row, here or by a feeder; an error here (the
        client's image) leaves the row to the next item."""
        if self.feeders is not None:
            lease, n = self._next_row(self.handler.pixel_shape)
            self._sent.append((item, lease, n, payload))
        else:
            pixels = self.handler.pixels(payload, item.content_type)
            lease, n = self._next_row(pixels.shape)
            self.handler.normalise_into(pixels, lease.tensor[n].numpy())
        item.value = lease.tensor[n]
        self._group.append(item)

    def groups(self) -> list[tuple[list[Item], torch.Tensor]]:
        """Each group and its rows (on the CPU; ``to_device`` moves them), its failed items left out."""
        self._close()
        if self._sent:
            self._feed()
        out = []
        for items, lease in self._groups:
            good = [item for item in items if item.error is None]
            rows = lease.tensor
            for n, item in enumerate(good):  # close up a failed row: the ones after it move down
                if item.value.data_ptr() != rows[n].data_ptr():
                    rows[n].copy_(item.value)
                    item.value = rows[n]
            if good:
                out.append((good, rows[: len(good)]))
        return out

    def to_device(self, rows: torch.Tensor) -> Any:
        return to_device(rows, self.handler.device, self.handler.dtype)

    def _next_row(self, shape: tuple[int, ...]) -> tuple[Lease, int]:
        lease = self._lease
        if lease is None or len(self._group) == len(lease.tensor) or tuple(lease.tensor.shape[1:]) != shape:
            self._close()
            capacity = max(1, self.runner.max_batch)
            lease = self._lease = self.runner.buffers.lease(
                (capacity, *shape),
                channels_last=self.runner.channels_last,
                pinned=self.handler.device.type == "cuda",
                shared=self.feeders is not None,
            )
            self.leases.append(lease)
        return lease, len(self._group)

    def _close(self) -> None:
        if self._group and self._lease is not None:
            self._groups.append((self._group, self._lease))
        self._group = []
        self._lease = None

    def _feed(self) -> None:
        """The feeders fill the rows sent, a contiguous run each (by buffer); the rows they could not fill fail."""
        from inferq.workers.feeders import split_rows

        assert self.feeders is not None
        by_lease: dict[int, list[tuple[Item, Lease, int, bytes]]] = defaultdict(list)
        for sent in self._sent:
            by_lease[id(sent[1])].append(sent)
        runs, here, items = [], {}, {}
        for sent_rows in by_lease.values():
            buffer = sent_rows[0][1].buffer
            assert buffer.segment is not None
            here[buffer.segment] = shared_rows_of(buffer)
            rows = [(n, payload, item.content_type) for item, _, n, payload in sent_rows]
            share = max(1, self.feeders.count * len(rows) // len(self._sent))
            runs += [(buffer.segment, buffer.shape, buffer.channels_last, run) for run in split_rows(rows, share)]
            items[buffer.segment] = {n: item for item, _, n, _ in sent_rows}
        failed = self.feeders.fill(self.handler, runs, here)
        for segment, by_row in items.items():
            for n, failure in failed.get(segment, {}).items():
                by_row[n].fail(failure.reason, told_traceback=failure.traceback, input_refused=failure.input_refused)
        self._sent = []


def shared_rows_of(buffer: Buffer) -> np.ndarray:
    """The worker's own view of a shared buffer, as a feeder maps it."""
    array = buffer.tensor.numpy()
    return array.transpose(0, 2, 3, 1) if buffer.channels_last and array.ndim == 4 else array
