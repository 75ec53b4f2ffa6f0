"""The batching worker's two helper threads, each living as long as the worker: the keep-alive, which keeps a
running batch's jobs and the worker alive in Redis, and the finisher, which stores a batch's results while the
worker takes the next one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any


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
