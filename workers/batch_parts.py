"""Parts of the batching worker that stand alone: its keep-alive thread, its finisher thread, per-item helpers.

The prefetch (the overlap) is workers/prefetch.py; waiting out Redis is workers/outage.py."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from rq.utils import now

from shared import metrics
from shared.lifecycle.store import Claimed
from workers.running import Item

log = logging.getLogger("workers.batching")


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
