"""Parts of the batching worker that stand alone: its keep-alive thread, the prefetched batch, per-item helpers.

With the overlap on (``INFERQ_OVERLAP``: by default on a CUDA device only), a one-slot prefetch
thread claims and pops the next batch, reads its inputs, preprocesses and collates it (into pinned
memory, copied to the device on a stream of its own) while the model runs the current one. The
prefetched jobs wait unstarted in the intermediate list, exactly like a batch being collected: a
stop gives them back to the front of their queue, a kill leaves them to RQ's cleanup, and they are
started (by the same start script) only once the current batch has finished.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from rq.queue import Queue
from rq.utils import now

from shared import metrics
from shared.lifecycle.store import Claimed
from workers.running import Item, ModelRunner, Prepared, prepare

log = logging.getLogger("workers.batching")

# A prefetched batch waits unstarted in RQ's intermediate list, where maintenance takes back a job left
# over a minute (it would run twice); one held this long (the batch before it runs long) goes back first.
PREFETCH_HOLD_LIMIT_S = 30.0


class KeepAlive:
    """One thread for the worker's life that calls ``beat(batch)`` every ``every_s`` while a batch runs.

    A thread started per batch cost more than a no-op model's whole batch. After ``end()`` returns, no
    beat for the batch that ended is running or will run.
    """

    def __init__(self, beat: Callable[[Any], None], every_s: float) -> None:
        self._beat = beat
        self._every_s = every_s
        self._cond = threading.Condition()
        self._busy = threading.Lock()  # held while a beat runs
        self._batch: Any = None
        self._thread: threading.Thread | None = None

    def begin(self, batch: Any) -> None:
        with self._cond:
            self._batch = batch
            self._cond.notify_all()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="inferq-keep-alive", daemon=True)
            self._thread.start()

    def end(self) -> None:
        with self._cond:
            self._batch = None
            self._cond.notify_all()
        with self._busy:  # a beat already under way finishes first
            pass

    def _moved_on(self, batch: Any) -> bool:
        return self._batch is not batch

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._batch is not None)
                batch = self._batch
                if self._cond.wait_for(partial(self._moved_on, batch), timeout=self._every_s):
                    continue  # it ended before its beat was due
            with self._busy:
                if self._batch is batch:
                    self._beat(batch)


@dataclass
class Prefetched:
    """The next batch, popped (not started) while the current one runs; ``prepared`` once it is ready."""

    queue: Queue
    job_ids: list[str]
    held_since: float
    items: list[Item] | None = None
    prepared: Prepared | None = None


def observe(acc: metrics.Increments, item: Item) -> None:
    """What one item adds to its model's metrics when its job ends (counted only if it ends here)."""
    job = item.job
    ended_at = job.ended_at or now()
    queued_s = (job.started_at - job.enqueued_at).total_seconds() if job.enqueued_at else None
    end_to_end_s = (ended_at - job.enqueued_at).total_seconds() if job.enqueued_at else None
    inference_s = float(item.info.get("inference_ms") or 0.0) / 1000.0
    status, reason = "finished", None
    if item.error is not None:
        status, reason = "failed", metrics.failure_class(item.error)
    metrics.job_increments(acc, status, queued_s, inference_s, end_to_end_s, reason=reason)


def same_jobs(started: list[Item], job_ids: list[str]) -> bool:
    """Whether the start kept every prefetched job, in order (a bulk chunk is never prepared ahead)."""
    return all(item.custom_id is None for item in started) and [item.job.id for item in started] == job_ids


def prepare_aside(runner: ModelRunner, items: list[Item]) -> Prepared:
    """Prepare a batch off the main thread; on a GPU its copies go on a stream of their own."""
    if runner.device.type != "cuda":
        return prepare(runner, items)
    stream = torch.cuda.Stream(runner.device)
    with torch.cuda.stream(stream):
        prepared = prepare(runner, items)
    prepared.stream = stream
    return prepared


def jobs_of(items: list[Item]) -> list[Claimed]:
    """The batch's jobs, once each: the items of a bulk chunk share theirs."""
    return list({id(item.job): item.job for item in items}.values())


class Finisher:
    """Stores a finished batch's results on a thread of its own while the worker takes the next batch.

    A batch's finish is Python work (each job's outcome, encoded) and then Redis work (one transaction); the
    next batch's claim, pop and start are Redis work, its loading Python work. On two threads the Redis
    server runs one batch's part while this process runs the other's, instead of each waiting in turn.
    Finishes stay in order, one in flight: a batch's finish first waits for the one before it, and
    re-raises what that one raised.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferq-finish")
        self._pending: Future[None] | None = None

    def submit(self, finish: Callable[[], None]) -> None:
        self.wait()
        self._pending = self._pool.submit(finish)

    def wait(self, timeout_s: float | None = None) -> None:
        """Until the latest finish has stored its results (or ``timeout_s`` passed: TimeoutError)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result(timeout_s)
