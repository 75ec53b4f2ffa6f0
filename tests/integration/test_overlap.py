"""The GPU-path overlap (INFERQ_OVERLAP), forced on the CPU: the next batch is prepared while the model
runs the current one, with the same results, and a prefetched batch is given back on a stop, never run twice.

In-process BatchWorker against a real redis-server. Ordering of events is asserted, never timing: the
model's forward pass waits (a bounded wait) until a later item's preprocessing has started, which only
an overlapping worker can bring about.
"""

from __future__ import annotations

import json
import signal
import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
import torch
from rq.utils import now

from inferq.shared.jobs import QueueCache, Submission, cancel_job, enqueue_job, get_job_view
from inferq.shared.lifecycle import claims
from inferq.shared.models import ModelConfig, TensorInput
from inferq.shared.settings import Settings
from inferq.workers.batching import BatchWorker
from inferq.workers.handlers import TensorHandler
from inferq.workers.running import ModelRunner

MAX_BATCH = 4
QUEUE = "rq:queue:inferq.rec"


class Recorder(TensorHandler):
    """Records preprocess and forward events; with ``wait_for_next``, a forward pass waits (at most
    ``WAIT_S``) until an item past its batch is being preprocessed."""

    WAIT_S = 10.0

    def load(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.cond = threading.Condition()
        self.preprocessed = 0
        self.forwarded = 0
        self.in_forward = False
        self.total = 0
        self.wait_for_next = False
        self.forwards: Counter[int] = Counter()
        self.on_forward: Callable[[list[int]], None] | None = None

    def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
        value = super().preprocess(payload, content_type)
        with self.cond:
            if self.wait_for_next and threading.current_thread() is not threading.main_thread():
                # The worker starts the prefetch thread just before the forward pass; on a loaded machine that
                # thread could record its items before the main thread reached predict(). It waits (bounded) for
                # a forward in progress: an overlapping worker then always shows pre after the forward started,
                # and a worker that prepared the next batch before the forward still fails the ordering below.
                self.cond.wait_for(lambda: self.in_forward, self.WAIT_S)
            self.events.append(("pre", int(value[0])))
            self.preprocessed += 1
            self.cond.notify_all()
        return value

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        ids = [int(v) for v in batch[:, 0]]
        self.forwards.update(ids)
        with self.cond:
            self.events.append(("forward", tuple(ids)))
            self.in_forward = True
            self.cond.notify_all()
            self.forwarded += len(ids)
            if self.wait_for_next:
                # Bounded: a worker that does not overlap fails the ordering assertions below, not by hanging.
                self.cond.wait_for(lambda: self.preprocessed > self.forwarded or self.forwarded >= self.total, 10.0)
        if self.on_forward is not None:
            self.on_forward(ids)
        with self.cond:
            self.events.append(("end", tuple(ids)))
            self.in_forward = False
        return batch * 1.0


def _runner(device: str = "cpu") -> ModelRunner:
    """A Recorder runner; ``device`` is only what it reports (the handler always runs on the CPU)."""
    config = ModelConfig(
        name="rec",
        path=Path("."),
        handler="tests.integration.test_overlap:Recorder",
        input=TensorInput(shape=[2], dtype="float32"),
        max_batch=MAX_BATCH,
    )
    handler = Recorder(config, torch.device("cpu"))
    handler.load()
    return ModelRunner(config, handler, torch.device(device), MAX_BATCH)


def _submit(redis: redis_py.Redis, settings: Settings, count: int) -> list[str]:
    queues = QueueCache(redis)
    payloads = [json.dumps({"inputs": [i, i * 10]}).encode() for i in range(count)]
    return [enqueue_job(queues, settings, Submission("rec", p, "application/json")).id for p in payloads]


def _worker(
    redis: redis_py.Redis, redis_url: str, overlap: str, name: str, device: str = "cpu"
) -> tuple[BatchWorker, Recorder]:
    settings = Settings(redis_url=redis_url, overlap=overlap)  # type: ignore[arg-type]
    runner = _runner(device)
    worker = BatchWorker({"rec": runner}, connection=redis, settings=settings, name=name)
    handler = runner.handler
    assert isinstance(handler, Recorder)
    return worker, handler


def test_overlap_is_on_by_default_only_on_a_cuda_device(redis: redis_py.Redis, redis_url: str) -> None:
    # A runner whose device reports cuda needs no GPU: the worker decides by the device its runners report.
    assert _worker(redis, redis_url, "auto", "auto-cuda", device="cuda")[0].overlap
    assert not _worker(redis, redis_url, "off", "off-cuda", device="cuda")[0].overlap
    assert not _worker(redis, redis_url, "auto", "auto-cpu")[0].overlap
    assert _worker(redis, redis_url, "on", "on-cpu")[0].overlap
    assert not _worker(redis, redis_url, "off", "off-cpu")[0].overlap


def test_the_next_batch_is_prepared_while_the_model_runs_with_the_same_results(
    redis: redis_py.Redis, redis_url: str
) -> None:
    settings = Settings(redis_url=redis_url)
    outcomes = {}
    for overlap in ("off", "on"):
        redis.flushall()
        ids = _submit(redis, settings, 10)
        worker, handler = _worker(redis, redis_url, overlap, f"overlap-{overlap}")
        handler.total = 10
        handler.wait_for_next = overlap == "on"
        worker.work(burst=True)
        views = [get_job_view(redis, i) for i in ids]
        outcomes[overlap] = [(v["status"], v["result"], v["batch_size"]) for v in views]
        assert handler.forwards == Counter(range(10))  # every job ran exactly once
        if overlap == "off":
            assert worker.batches_prefetched == 0
            continue
        assert worker.batches_run == 3 and worker.batches_prefetched == 2
        events = handler.events
        forwards = [e[1] for e in events if e[0] == "forward"]
        assert forwards == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]
        for this, following in zip(forwards, forwards[1:], strict=False):
            first_pre = events.index(("pre", following[0]))
            assert events.index(("forward", this)) < first_pre < events.index(("end", this)), events
        assert redis.llen(f"{QUEUE}:intermediate") == 0
    assert outcomes["on"] == outcomes["off"]
    assert all(status == "finished" for status, _, _ in outcomes["on"])


def test_a_worker_prefetches_again_when_it_works_again(redis: redis_py.Redis, redis_url: str) -> None:
    settings = Settings(redis_url=redis_url)
    worker, handler = _worker(redis, redis_url, "on", "overlap-twice")
    for round_ in range(2):
        _submit(redis, settings, 8)
        handler.total, handler.forwarded, handler.preprocessed = 8, 0, 0
        worker.work(burst=True)
        assert worker.batches_prefetched == round_ + 1  # the second of each round's two batches
    assert redis.llen(f"{QUEUE}:intermediate") == 0


def test_a_job_canceled_while_prefetched_is_dropped_and_the_rest_run_once(
    redis: redis_py.Redis, redis_url: str
) -> None:
    settings = Settings(redis_url=redis_url)
    ids = _submit(redis, settings, 8)
    worker, handler = _worker(redis, redis_url, "on", "overlap-cancel")
    handler.total = 8
    handler.wait_for_next = True

    def cancel_one_prefetched(batch: list[int]) -> None:
        if batch[0] == 0:  # batch 2 (jobs 4-7) is popped and being prepared: cancel job 5
            cancel_job(QueueCache(redis), settings, ids[5])

    handler.on_forward = cancel_one_prefetched
    worker.work(burst=True)
    statuses = [get_job_view(redis, i)["status"] for i in ids]
    assert statuses == ["finished"] * 5 + ["canceled"] + ["finished"] * 2
    assert handler.forwards == Counter([0, 1, 2, 3, 4, 6, 7])
    assert redis.llen(f"{QUEUE}:intermediate") == 0


def test_a_stop_gives_the_prefetched_batch_back_unstarted(redis: redis_py.Redis, redis_url: str) -> None:
    settings = Settings(redis_url=redis_url)
    ids = _submit(redis, settings, 10)
    worker, handler = _worker(redis, redis_url, "on", "overlap-stop")
    handler.total = 10
    handler.wait_for_next = True

    def stop_during_first(batch: list[int]) -> None:
        if batch[0] == 0:
            worker.request_stop(signal.SIGTERM, None)  # what the first SIGTERM does

    handler.on_forward = stop_during_first
    worker.work(burst=True)
    assert [get_job_view(redis, i)["status"] for i in ids] == ["finished"] * 4 + ["queued"] * 6
    # Batch 2 was popped and preprocessed, never started: back at the front of the queue, in order.
    assert any(e == ("pre", 4) for e in handler.events)
    assert [i.decode() for i in redis.lrange(QUEUE, 0, -1)] == ids[4:]
    assert redis.llen(f"{QUEUE}:intermediate") == 0
    assert redis.zcard("rq:wip:inferq.rec") == 0

    again, second = _worker(redis, redis_url, "off", "overlap-after-stop")
    again.work(burst=True)
    assert [get_job_view(redis, i)["status"] for i in ids] == ["finished"] * 10
    assert handler.forwards + second.forwards == Counter(range(10))  # none ran twice


def test_a_forced_stop_gives_back_the_running_batch_then_the_prefetched_one(
    redis: redis_py.Redis, redis_url: str
) -> None:
    settings = Settings(redis_url=redis_url)
    ids = _submit(redis, settings, 10)
    worker, handler = _worker(redis, redis_url, "on", "overlap-force")
    handler.total = 10
    handler.wait_for_next = True

    def force_stop_during_first(batch: list[int]) -> None:
        if batch[0] == 0:
            worker._shutdown_requested_date = now() - timedelta(seconds=5)  # a first SIGTERM, a while ago
            worker.request_force_stop(signal.SIGTERM, None)  # the second one

    handler.on_forward = force_stop_during_first
    with pytest.raises(SystemExit):
        worker.work(burst=True)
    assert [get_job_view(redis, i)["status"] for i in ids] == ["queued"] * 10
    assert [i.decode() for i in redis.lrange(QUEUE, 0, -1)] == ids
    assert redis.llen(f"{QUEUE}:intermediate") == 0
    assert redis.zcard("rq:wip:inferq.rec") == 0


def test_a_batch_read_ahead_is_started_without_carrying_its_inputs_back(
    redis: redis_py.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefetch reads a batch's inputs before its start; the start script returned every input again (a 34 KB
    JPEG's bytes crossing Redis a second time, issue 46). Now only a batch not read ahead gets them from it."""
    settings = Settings(redis_url=redis_url)
    ids = _submit(redis, settings, 10)
    carried: list[bool] = []
    started = claims.started

    def counting(call: Any, replies: list[Any]) -> Any:
        result = started(call, replies)
        carried.extend(job.payload is not None for job in result.jobs)
        return result

    monkeypatch.setattr(claims, "started", counting)
    worker, handler = _worker(redis, redis_url, "on", "overlap-once")
    handler.total = 10
    handler.wait_for_next = True
    worker.work(burst=True)
    assert worker.batches_prefetched == 2
    assert carried == [True] * 4 + [False] * 6  # the first batch's start read them; the prefetch read the rest
    assert [get_job_view(redis, i)["result"]["output"] for i in ids] == [[i, i * 10] for i in range(10)]
