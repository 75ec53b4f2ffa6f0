"""The overlap's one-slot prefetch: the next batch claimed, popped, read and prepared while the model runs this one.

With the overlap on (``INFERQ_OVERLAP``: by default on a CUDA device only), a thread claims and pops the next batch,
reads its inputs, preprocesses and collates it (into pinned memory, copied to the device on a stream of its own)
while the model runs the current one. The prefetched jobs wait unstarted in the intermediate list, exactly like a
batch being collected: a stop gives them back to the front of their queue, a kill leaves them to maintenance, and
they are started (by the same start script) only once the current batch has finished.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis
import torch
from redis import Redis
from rq.queue import Queue

from inferq.shared import keys
from inferq.shared.lifecycle import claims, layout
from inferq.workers.outage import Outage
from inferq.workers.running import Item, ModelRunner, Prepared, prepare

log = logging.getLogger("inferq.workers.batching")

# A prefetched batch waits unstarted in RQ's intermediate list, where maintenance takes back a job left
# over a minute (it would run twice); one held this long (the batch before it runs long) goes back first.
PREFETCH_HOLD_LIMIT_S = 30.0


@dataclass
class Prefetched:
    """The next batch, popped (not started) while the current one runs; ``prepared`` once it is ready."""

    queue: Queue
    job_ids: list[str]
    held_since: float
    items: list[Item] | None = None
    prepared: Prepared | None = None

    def inputs(self) -> dict[str, bytes | None] | None:
        """Its jobs' inputs by id, as read ahead; None when they were not read (a bulk chunk: its start reads it)."""
        if self.items is None:
            return None
        return {job_id: item.payload for job_id, item in zip(self.job_ids, self.items, strict=True)}

    def adopt(self, started: list[Item]) -> tuple[list[Item], Prepared] | None:
        """The batch as prepared, its items given the jobs the start returned; None if it was never prepared or
        the start dropped some of it (canceled, expired): then what did start is prepared again, as usual."""
        if self.prepared is None or self.items is None or not same_jobs(started, self.job_ids):
            if self.prepared is not None:
                self.prepared.give_back()
            return None
        for mine, item in zip(self.items, started, strict=True):
            mine.job, mine.info = item.job, item.info
        return self.items, self.prepared


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


class Prefetcher:
    """One worker's prefetch thread, its one slot and its give-back: ``ahead`` (being popped or prepared by the
    thread), then ``ready`` (taken by the dequeue, handed over to execute_job); a stop gives either back.

    ``claim(None)`` is the worker's claim (its lane policy), never blocking; ``stopping()`` says a stop was asked.
    """

    def __init__(
        self,
        *,
        connection: Redis,
        runners: dict[str, ModelRunner],
        claim: Callable[[Any], tuple[str, Queue] | None],
        stopping: Callable[[], bool],
        outage: Outage,
        worker_name: str,
    ) -> None:
        self.connection = connection
        self.runners = runners
        self.claim = claim
        self.stopping = stopping
        self.outage = outage
        self.worker_name = worker_name
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.ahead: Prefetched | None = None
        self.ready: Prefetched | None = None
        self.closed = False
        self.count = 0  # batches prepared ahead

    def open(self) -> None:
        """Prefetch (again): a worker may work() again after a burst, whose end closed the prefetch."""
        self.closed = False

    @property
    def holding(self) -> bool:
        """Whether the thread has popped a batch that waits, unstarted, for its turn."""
        return self.ahead is not None

    def start(self) -> None:
        """Start the prefetch thread, unless one is still busy or a prefetched batch waits."""
        if self.closed or self.stopping() or self.ahead is not None:
            return
        if self.thread is not None and self.thread.is_alive():
            return
        self.thread = threading.Thread(target=self._run, name="inferq-prefetch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        """Claim and pop the next batch (never blocking), read its inputs and prepare it."""
        try:
            with self.lock:
                if self.closed or self.stopping():
                    return
                claimed = self.claim(None)
                if claimed is None:
                    return
                job_id, queue = claimed
                ahead = Prefetched(queue, [job_id], time.monotonic())
                self.ahead = ahead
                if keys.is_chunk(job_id):
                    return  # a bulk chunk: a batch of its own, prepared once started (its items are in it)
                runner = self.runners[keys.model_from_queue(queue.name)]
                ahead.job_ids += claims.pop(self.connection, layout.queue_keys(queue.name), runner.max_batch - 1)
            inputs = claims.read_inputs(self.connection, ahead.job_ids)
            # The jobs are not started yet: the start script gives each its job; until then, no job.
            items = [Item(cast(Any, None), payload, content_type) for payload, content_type in inputs]
            prepared = prepare_aside(runner, items)
            with self.lock:
                if self.ahead is ahead:
                    ahead.items, ahead.prepared = items, prepared
                    self.count += 1
        except Exception:  # the jobs stay held; the main loop starts and prepares them as usual
            log.exception("worker %s: preparing the next batch failed", self.worker_name)

    def take(self) -> Prefetched | None:
        """The prefetched batch, once the thread is done with it, kept as ``ready`` until execute_job's
        ``hand_over``; None when there is none."""
        thread = self.thread
        if thread is not None:
            thread.join()
            self.thread = None
        with self.lock:
            ahead, self.ahead = self.ahead, None
        if ahead is not None:
            self.ready = ahead
        return ahead

    def hand_over(self) -> Prefetched | None:
        """The batch the dequeue took (``ready``), for execute_job; None when it took none."""
        ready, self.ready = self.ready, None
        return ready

    def give_back(self, wait_s: float | None = None) -> None:
        """Put a prefetched batch back at the front of its queue, and prefetch no more."""
        if not self.lock.acquire(timeout=-1 if wait_s is None else wait_s):
            log.warning("worker %s: the prefetch thread holds its lock; RQ's cleanup will requeue", self.worker_name)
            return
        try:
            self.closed = True
            ahead, self.ahead = self.ahead, None
            ready, self.ready = self.ready, None
        finally:
            self.lock.release()
        for batch in (ahead, ready):
            if batch is not None:
                self._give_back(batch)

    def close(self) -> None:
        """The loop ended: wait for the thread, then give back what it took."""
        self.closed = True
        thread = self.thread
        if thread is not None:
            thread.join(timeout=30)
        self.outage.skip(self.give_back, "giving back a prefetched batch")

    def expire(self) -> None:
        """A batch held longer than PREFETCH_HOLD_LIMIT_S goes back to its queue before maintenance takes it."""
        with self.lock:
            ahead = self.ahead
            if ahead is None or time.monotonic() - ahead.held_since < PREFETCH_HOLD_LIMIT_S:
                return
            self.ahead = None
        try:
            self._give_back(ahead)
        except redis.exceptions.RedisError as exc:
            log.warning("worker %s: giving back a prefetched batch failed (%s)", self.worker_name, exc)

    def _give_back(self, batch: Prefetched) -> None:
        """Popped jobs that never started back at the front of their queue, in order."""
        back = claims.give_back_held(self.connection, layout.queue_keys(batch.queue.name), batch.job_ids)
        name = batch.queue.name
        log.warning("worker %s: cold shutdown; %d held job(s) given back to %s", self.worker_name, len(back), name)
