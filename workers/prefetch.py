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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import redis
import torch
from rq.queue import Queue

from shared import keys
from shared.lifecycle import layout, store
from workers.running import Item, ModelRunner, Prepared, prepare

if TYPE_CHECKING:
    from workers.batching import BatchWorker

log = logging.getLogger("workers.batching")

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
    """One worker's prefetch thread and its one slot: ``ahead`` (being popped or prepared by the thread), then
    ``ready`` (handed from the dequeue to execute_job)."""

    def __init__(self, worker: BatchWorker) -> None:
        self.worker = worker
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.ahead: Prefetched | None = None
        self.ready: Prefetched | None = None
        self.closed = False
        self.count = 0  # batches prepared ahead

    def start(self) -> None:
        """Start the prefetch thread, unless one is still busy or a prefetched batch waits."""
        if self.closed or self.worker._stop_requested or self.ahead is not None:
            return
        if self.thread is not None and self.thread.is_alive():
            return
        self.thread = threading.Thread(target=self._run, name="inferq-prefetch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        """Claim and pop the next batch (never blocking), read its inputs and prepare it."""
        worker = self.worker
        try:
            with self.lock:
                if self.closed or worker._stop_requested:
                    return
                claimed = worker._claim(None)
                if claimed is None:
                    return
                job_id, queue = claimed
                ahead = Prefetched(queue, [job_id], time.monotonic())
                self.ahead = ahead
                if keys.is_chunk(job_id):
                    return  # a bulk chunk: a batch of its own, prepared once started (its items are in it)
                runner = worker.runners[keys.model_from_queue(queue.name)]
                ahead.job_ids += store.pop(worker.connection, layout.queue_keys(queue.name), runner.max_batch - 1)
            inputs = store.read_inputs(worker.connection, ahead.job_ids)
            # The jobs are not started yet: the start script gives each its job; until then, no job.
            items = [Item(cast(Any, None), payload, content_type) for payload, content_type in inputs]
            prepared = prepare_aside(runner, items)
            with self.lock:
                if self.ahead is ahead:
                    ahead.items, ahead.prepared = items, prepared
                    self.count += 1
        except Exception:  # the jobs stay held; the main loop starts and prepares them as usual
            log.exception("worker %s: preparing the next batch failed", worker.name)

    def take(self) -> Prefetched | None:
        """The prefetched batch, once the thread is done with it; None when there is none."""
        thread = self.thread
        if thread is not None:
            thread.join()
            self.thread = None
        with self.lock:
            ahead, self.ahead = self.ahead, None
        return ahead

    def hand_over(self) -> Prefetched | None:
        """The batch the dequeue took (``ready``), for execute_job; None when it took none."""
        ready, self.ready = self.ready, None
        return ready

    def give_back(self, wait_s: float | None = None) -> None:
        """Put a prefetched batch back at the front of its queue, and prefetch no more."""
        if not self.lock.acquire(timeout=-1 if wait_s is None else wait_s):
            log.warning("worker %s: the prefetch thread holds its lock; RQ's cleanup will requeue", self.worker.name)
            return
        try:
            self.closed = True
            ahead, self.ahead = self.ahead, None
            ready, self.ready = self.ready, None
        finally:
            self.lock.release()
        for batch in (ahead, ready):
            if batch is not None:
                self.worker._give_back_held(batch.queue, batch.job_ids)

    def close(self) -> None:
        """The loop ended: wait for the thread, then give back what it took."""
        self.closed = True
        thread = self.thread
        if thread is not None:
            thread.join(timeout=30)
        self.worker.outage.skip(self.give_back, "giving back a prefetched batch")

    def expire(self) -> None:
        """A batch held longer than PREFETCH_HOLD_LIMIT_S goes back to its queue before maintenance takes it."""
        with self.lock:
            ahead = self.ahead
            if ahead is None or time.monotonic() - ahead.held_since < PREFETCH_HOLD_LIMIT_S:
                return
            self.ahead = None
        try:
            self.worker._give_back_held(ahead.queue, ahead.job_ids)
        except redis.exceptions.RedisError as exc:
            log.warning("worker %s: giving back a prefetched batch failed (%s)", self.worker.name, exc)
