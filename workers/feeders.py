"""Feeders: processes that decode and normalise a batch's images into its shared buffer, so the worker's own
process (the one that drives the model) spends its time on forwards, and every core decodes.

Measured before (issue 46): decode, normalisation and collation ran as one serial loop in the model's process,
1.26 ms of CPU per 224x224 JPEG, so one worker fed a GPU at most about 800 images a second whatever the cores.
With feeders on, the worker leases a batch buffer in shared memory (``workers.buffers``), hands each feeder a
contiguous run of its rows with their images' bytes, and waits; each feeder does exactly what
``ImageClassifier.pixels`` and ``normalise_into`` do in the worker (the same built-in code: only a handler whose
preprocessing is the built-in one is fed so), and answers which rows failed and why. Nothing is pickled but the
runs the worker sends its own children and their answers (bytes, numbers and strings).

A feeder that dies mid-batch loses nothing: its rows are decoded in the worker's process, the pool is started
again for the next batch, and the death is logged. How many: ``INFERQ_FEEDERS`` (``auto``: on a CUDA device the
cores the worker may use, at most 16; on the CPU none, since the forward itself wants the cores).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from inferq.shared.errors import InvalidInput
from inferq.shared.models import ModelConfig
from inferq.workers.cpu_threads import usable_cores
from inferq.workers.handlers import ImageClassifier

if TYPE_CHECKING:
    from inferq.shared.settings import Settings
    from inferq.workers.running import ModelRunner

log = logging.getLogger(__name__)

MAX_AUTO = 16
PARENT_CHECK_S = 1.0  # how often a feeder looks whether its worker is still its parent


def count_for(setting: int | str, device: torch.device) -> int:
    """The feeders a worker starts for an image model on ``device``: the setting's number, or ``auto``'s."""
    if setting != "auto":
        return int(setting)
    return min(MAX_AUTO, usable_cores()) if device.type == "cuda" else 0


def start_feeders(runner: ModelRunner, setting: int | str, settings: Settings) -> None:
    """Give ``runner`` its feeders, when its handler's batches are written in place (``buffers.filler``) and the
    setting asks for some on its device."""
    from inferq.workers.buffers import filler

    count = count_for(setting, runner.device)
    if count <= 0 or filler(runner.handler) is None:
        return
    runner.feeders = Feeders(runner.config, count, settings.max_image_pixels)
    atexit.register(runner.feeders.close)
    atexit.register(runner.buffers.close)
    log.info("model %s: %d feeder process(es) decode its images", runner.config.name, count)


@dataclass(frozen=True)
class Failure:
    """A row a feeder could not fill: the reason a client reads, the traceback, whether it was the input's fault."""

    reason: str
    traceback: str
    input_refused: bool


# A run of rows for one feeder: the buffer (segment name, shape, channels-last), then (row, payload, content type).
Run = tuple[str, tuple[int, ...], bool, list[tuple[int, bytes, str]]]


class Feeders:
    """A pool of feeder processes for one image model, started at once so the first batch does not wait."""

    def __init__(self, config: ModelConfig, count: int, max_image_pixels: int) -> None:
        self.config = config
        self.count = count
        self.max_image_pixels = max_image_pixels
        self.deaths = 0  # pools found broken: a feeder died
        self._pool: ProcessPoolExecutor | None = None
        self._start()

    def fill(
        self, handler: ImageClassifier, runs: list[Run], here: dict[str, np.ndarray]
    ) -> dict[str, dict[int, Failure]]:
        """Fill every run's rows; the rows that failed, by buffer (segment name) and row. A run whose feeder
        died is filled here, in the worker's process, by the same code, into ``here`` (the worker's own views of
        the buffers, by segment name)."""
        pool = self._pool or self._start()
        futures: list[tuple[Run, Future[list[tuple[int, str, str, bool]]] | None]] = []
        for run in runs:
            try:
                futures.append((run, pool.submit(fill_run, run)))
            except (BrokenProcessPool, RuntimeError):
                futures.append((run, None))
        failures: dict[str, dict[int, Failure]] = {}
        broken = False
        for run, future in futures:
            try:
                if future is None:
                    raise BrokenProcessPool("the pool was broken before this run was sent")
                answers = future.result()
            except BrokenProcessPool:
                broken = True
                answers = _fill(handler, here[run[0]], run[2], run[3])
            for row, reason, trace, refused in answers:
                failures.setdefault(run[0], {})[row] = Failure(reason, trace, refused)
        if broken:
            self.deaths += 1
            name = self.config.name
            log.warning("model %s: a feeder died; its images were decoded in the worker, feeders restart", name)
            self._stop()
        return failures

    def close(self) -> None:
        self._stop()

    def _start(self) -> ProcessPoolExecutor:
        # Spawned, never forked: the worker has threads (and maybe CUDA) that a fork would copy half-way.
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(
            self.count,
            mp_context=context,
            initializer=_init,
            initargs=(self.config.model_dump_json(), self.max_image_pixels, os.getpid()),
        )
        # Each process starts now (its imports, the handler), not on the first batch: at the worker's load, and again
        # on the batch after a death.
        started = [pool.submit(os.getpid) for _ in range(self.count)]
        for future in started:
            with contextlib.suppress(BrokenProcessPool):
                future.result()
        self._pool = pool
        return pool

    def _stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def split_rows(rows: list[tuple[int, bytes, str]], parts: int) -> list[list[tuple[int, bytes, str]]]:
    """``rows`` cut into at most ``parts`` contiguous runs of near-equal length."""
    parts = max(1, min(parts, len(rows)))
    size, extra = divmod(len(rows), parts)
    out, at = [], 0
    for n in range(parts):
        end = at + size + (1 if n < extra else 0)
        out.append(rows[at:end])
        at = end
    return [run for run in out if run]


# The feeder process's own state: the built-in image handler (no weights) and the buffers it has mapped.
_HANDLER: ImageClassifier | None = None
_MAPPED: dict[str, tuple[Any, np.ndarray]] = {}


def _init(config_json: str, max_image_pixels: int, worker: int) -> None:
    global _HANDLER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's Ctrl-C is the worker's: it stops its feeders
    # A worker killed with SIGKILL cannot stop its feeders: each ends by itself once its parent is gone (it is
    # handed to another parent then), rather than linger with its memory after inferq up has started a new worker.
    # The worker's pid comes from the worker: one killed while this feeder was still importing had left it, asking
    # its own parent then, watching the process it had been handed to.
    threading.Thread(target=_end_with, args=(worker,), name="inferq-feeder-parent", daemon=True).start()
    torch.set_num_threads(1)
    config = ModelConfig.model_validate_json(config_json)
    _HANDLER = ImageClassifier(config, torch.device("cpu"), max_image_pixels=max_image_pixels)
    import inferq.workers.buffers
    import inferq.workers.running  # noqa: F401  # what a run imports (``readable``): loaded now, not in a batch


def _end_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def fill_run(run: Run) -> list[tuple[int, str, str, bool]]:
    """In a feeder: decode and normalise each row of ``run`` into its shared buffer; the failures."""
    from multiprocessing import shared_memory

    from inferq.workers.buffers import shared_rows

    assert _HANDLER is not None, "a feeder runs a run only once its initializer built the handler"
    name, shape, channels_last, rows = run
    mapped = _MAPPED.get(name)
    if mapped is None:
        segment = shared_memory.SharedMemory(name=name)
        mapped = _MAPPED[name] = (segment, shared_rows(segment.buf, shape, channels_last))
    return _fill(_HANDLER, mapped[1], channels_last, rows)


def _fill(
    handler: ImageClassifier, buffer: np.ndarray, channels_last: bool, rows: list[tuple[int, bytes, str]]
) -> list[tuple[int, str, str, bool]]:
    from inferq.workers.buffers import row_view
    from inferq.workers.running import readable

    failures = []
    for row, payload, content_type in rows:
        try:
            handler.normalise_into(handler.pixels(payload, content_type), row_view(buffer, row, channels_last))
        except Exception as exc:  # one bad image fails alone
            trace = "".join(traceback.format_exception(exc))
            failures.append((row, readable(exc), trace, isinstance(exc, InvalidInput)))
    return failures
