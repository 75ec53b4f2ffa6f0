"""The batching worker: RQ's own loop, one forward pass per batch of whatever is waiting.

RQ's ``work()`` loop keeps registration, heartbeats, suspension, warm shutdown and
maintenance; it blocks for one job and calls ``execute_job``. We take that job, greedily pop
what else is already waiting on its queue (up to the model's ``max_batch``), mark them all
started in one transaction, run the model once, and finish them all in one transaction.
RQ's per-job helpers (``perform_job``, ``handle_job_success``) are never used: they cost
about 18 round trips per job.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import torch
from redis import Redis, WatchError
from rq.executions import Execution
from rq.job import JobStatus
from rq.queue import Queue
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.worker import SimpleWorker, WorkerStatus

from shared import keys
from shared.errors import AppError
from shared.jobs import QueueCache, enqueue_webhook, publish_event
from shared.models import ModelConfig
from shared.rqjson import JSONJob, JSONQueue
from shared.settings import Settings
from workers.handlers import Handler, move_batch

log = logging.getLogger(__name__)

# LPOP with a count needs Redis >= 6.2; moving the IDs to RQ's intermediate list in the same
# script means a worker killed right after the pop leaves them where RQ's maintenance finds them.
_POP_MORE = """
local ids = redis.call('LPOP', KEYS[1], ARGV[1])
if not ids then return {} end
for _, id in ipairs(ids) do redis.call('RPUSH', KEYS[2], id) end
return ids
"""
# Read every job hash, payload and info hash of a batch in one round trip, under WATCH.
_LOAD = """
local n = tonumber(ARGV[1])
local out = {}
for i = 1, n do
  out[i] = redis.call('HGETALL', KEYS[i])
  out[n + i] = redis.call('GET', KEYS[n + i]) or false
  out[2 * n + i] = redis.call('HGETALL', KEYS[2 * n + i])
end
return out
"""
_STATUSES = """
local out = {}
for i, k in ipairs(KEYS) do out[i] = redis.call('HGET', k, 'status') or false end
return out
"""


@dataclass
class Item:
    """One job of a batch and what happened to it."""

    job: JSONJob
    payload: bytes | None
    content_type: str
    execution: Execution | None = None
    tensor: torch.Tensor | None = None
    output: Any = None
    error: str | None = None
    traceback: str | None = None
    info: dict[str, str] = field(default_factory=dict)

    def fail(self, reason: str, exc: BaseException | None = None) -> None:
        self.error = reason
        self.traceback = "".join(traceback.format_exception(exc)) if exc is not None else reason


@dataclass
class ModelRunner:
    """A loaded model and how to batch it."""

    config: ModelConfig
    handler: Handler
    device: torch.device
    max_batch: int


def readable(exc: BaseException) -> str:
    """A short reason a client can read."""
    if isinstance(exc, AppError):
        return exc.message
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class BatchWorker(SimpleWorker):
    """An RQ SimpleWorker that runs each model on batches of the jobs waiting for it."""

    queue_class = JSONQueue  # type: ignore[assignment]
    job_class = JSONJob

    def __init__(
        self,
        runners: dict[str, ModelRunner],
        *,
        connection: Redis,
        settings: Settings,
        max_wait_ms: float = 0.0,
        name: str | None = None,
    ) -> None:
        super().__init__(
            [keys.queue_name(model) for model in runners],
            name=name,
            connection=connection,
            serializer=JSONSerializer,
            job_class=JSONJob,
            queue_class=JSONQueue,
            worker_ttl=settings.worker_ttl_s,
            maintenance_interval=settings.maintenance_interval_s,
            default_result_ttl=settings.result_ttl_s,
        )
        self.runners = runners
        self.settings = settings
        self.max_wait_ms = max_wait_ms
        self.queue_cache = QueueCache(connection)
        self._pop_more = connection.register_script(_POP_MORE)
        self.batches_run = 0

    # -- RQ hook -------------------------------------------------------------------------
    def execute_job(self, job: JSONJob, queue: Queue) -> None:  # type: ignore[override]
        runner = self.runners[keys.model_from_queue(queue.name)]
        ids = [job.id, *self._collect(queue, runner.max_batch - 1, job)]
        items = self._start(ids, queue)
        if items:
            self._run(runner, items)
            self._finish(runner, items, queue)
        self.batches_run += 1

    def get_heartbeat_ttl(self, job: JSONJob) -> int:  # type: ignore[override]
        return int(job.timeout or self.settings.job_timeout_s) + 60

    # -- collect ---------------------------------------------------------------------------
    def _collect(self, queue: Queue, want: int, first: JSONJob) -> list[str]:
        """Pop up to ``want`` more job IDs already waiting; with max_wait_ms, wait for more."""
        if want <= 0:
            return []
        ids = self._pop(queue, want)
        if self.max_wait_ms > 0 and len(ids) < want:
            enqueued = first.enqueued_at or now()
            deadline = enqueued.timestamp() + self.max_wait_ms / 1000.0
            while len(ids) < want and time.time() < deadline:
                time.sleep(min(0.002, max(0.0, deadline - time.time())))
                ids += self._pop(queue, want - len(ids))
        return ids

    def _pop(self, queue: Queue, count: int) -> list[str]:
        popped = self._pop_more(keys=[queue.key, queue.intermediate_queue_key], args=[count])
        return [i.decode() if isinstance(i, bytes) else str(i) for i in popped]

    # -- start -----------------------------------------------------------------------------
    def _start(self, ids: list[str], queue: Queue) -> list[Item]:
        """Load the batch and mark every live job started, in one transaction."""
        job_keys = [JSONJob.key_for(i) for i in ids]
        payload_keys = [keys.payload_key(i) for i in ids]
        info_keys = [keys.info_key(i) for i in ids]
        with self.connection.pipeline(transaction=True) as pipe:
            while True:
                try:
                    # WATCH: a cancel landing between this read and the start must win.
                    pipe.watch(*job_keys)
                    loaded = pipe.execute_command(
                        "EVAL", _LOAD, 3 * len(ids), *job_keys, *payload_keys, *info_keys, len(ids)
                    )
                    items: list[Item] = []
                    dropped: list[str] = []
                    for index, job_id in enumerate(ids):
                        flat = loaded[index]
                        raw = dict(zip(flat[::2], flat[1::2], strict=True))
                        status = raw.get(b"status", b"").decode()
                        if not raw or status != JobStatus.QUEUED:
                            # Expired while queued, or canceled: it must not run.
                            dropped.append(job_id)
                            continue
                        job = JSONJob(job_id, connection=self.connection)
                        job.restore(raw)
                        payload = loaded[len(ids) + index] or None
                        info = _pairs(loaded[2 * len(ids) + index])
                        items.append(Item(job, payload, info.get("content_type", ""), info=info))
                    pipe.multi()
                    for job_id in dropped:
                        pipe.lrem(queue.intermediate_queue_key, 1, job_id)
                    self._write_start(pipe, items, queue)
                    pipe.execute()
                    return items
                except WatchError:
                    continue

    def _write_start(self, pipe: Any, items: list[Item], queue: Queue) -> None:
        if not items:
            return
        heartbeat_ttl = self.get_heartbeat_ttl(items[0].job)
        for item in items:
            job = item.job
            item.execution = Execution.create(job, heartbeat_ttl, pipeline=pipe, worker_name=self.name)
            job.prepare_for_execution(self.name, pipeline=pipe)
            # A job that started near its queue TTL must not expire mid-run.
            pipe.expire(job.key, heartbeat_ttl + self.settings.failure_ttl_s)
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            publish_event(pipe, job.id, keys.model_from_queue(queue.name), "started", batch_size=len(items))
        self.set_state(WorkerStatus.BUSY, pipeline=pipe)
        self.set_current_job_id(items[0].job.id, pipeline=pipe)
        self.heartbeat(heartbeat_ttl, pipeline=pipe)

    # -- run -------------------------------------------------------------------------------
    def _run(self, runner: ModelRunner, items: list[Item]) -> None:
        """Preprocess per item, one forward pass for the survivors, postprocess per item."""
        started = time.perf_counter()
        for item in items:
            if item.payload is None:
                item.fail("the job's input expired before it ran")
                continue
            try:
                item.tensor = runner.handler.preprocess(item.payload, item.content_type)
            except Exception as exc:  # one bad item fails only its own job
                item.fail(readable(exc), exc)
        self._predict(runner, [item for item in items if item.error is None])
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        for item in items:
            item.info["inference_ms"] = f"{elapsed_ms:.3f}"

    def _predict(self, runner: ModelRunner, items: list[Item]) -> None:
        """Run a batch; if the whole batch fails, split it so only the guilty item fails."""
        if not items:
            return
        try:
            batch = move_batch(torch.stack([item.tensor for item in items]), runner.device)  # type: ignore[misc]
            outputs = runner.handler.predict(batch)
            if len(outputs) != len(items):
                raise RuntimeError(f"model returned {len(outputs)} rows for {len(items)} inputs")
            outputs = outputs.detach().to("cpu")
        except Exception as exc:
            if len(items) == 1:
                log.exception("model failed on job %s", items[0].job.id)
                items[0].fail(f"model failed on this input: {readable(exc)}", exc)
                return
            log.warning("batch of %d failed (%s); splitting to isolate the bad item", len(items), exc)
            half = len(items) // 2
            self._predict(runner, items[:half])
            self._predict(runner, items[half:])
            return
        for item, row in zip(items, outputs, strict=True):
            try:
                output = runner.handler.postprocess(row)
                json.dumps(output, allow_nan=False)  # the result must be storable as JSON
                item.output = output
            except Exception as exc:
                item.fail(f"could not encode the output: {readable(exc)}", exc)

    # -- finish ----------------------------------------------------------------------------
    def _finish(self, runner: ModelRunner, items: list[Item], queue: Queue) -> None:
        """Store every result, move registries, publish events: one transaction."""
        job_keys = [item.job.key for item in items]
        ended_at = now()
        for item in items:
            item.job.ended_at = ended_at
            enqueued = item.job.enqueued_at
            started = item.job.started_at
            if enqueued and started:
                item.info["queue_ms"] = f"{_ms_between(enqueued, started):.3f}"
        with self.connection.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(*job_keys)
                    statuses = pipe.execute_command("EVAL", _STATUSES, len(job_keys), *job_keys)
                    pipe.multi()
                    succeeded = failed = 0
                    for item, status in zip(items, statuses, strict=True):
                        canceled = status in (b"canceled", "canceled")
                        if not canceled:
                            self._write_end(pipe, item, len(items), runner)
                            succeeded += item.error is None
                            failed += item.error is not None
                        if item.execution is not None:
                            item.execution.delete(item.job, pipeline=pipe)
                        pipe.delete(keys.payload_key(item.job.id))
                    if succeeded:
                        pipe.hincrby(self.key, "successful_job_count", succeeded)
                    if failed:
                        pipe.hincrby(self.key, "failed_job_count", failed)
                    started_at = items[0].job.started_at or ended_at
                    pipe.hincrbyfloat(self.key, "total_working_time", (ended_at - started_at).total_seconds())
                    self.set_current_job_id(None, pipeline=pipe)
                    self.set_state(WorkerStatus.IDLE, pipeline=pipe)
                    pipe.execute()
                    return
                except WatchError:
                    continue

    def _write_end(self, pipe: Any, item: Item, batch_size: int, runner: ModelRunner) -> None:
        job = item.job
        model = runner.config.name
        info = {**item.info, "batch_size": str(batch_size), "worker": self.name}
        if item.error is None:
            result_ttl = job.get_result_ttl(self.settings.result_ttl_s)
            job._result = item.output
            job._handle_success(
                result_ttl,
                pipeline=pipe,
                worker_name=self.name,
                execution_id=item.execution.id if item.execution else None,
                execution_started_at=item.execution.created_at if item.execution else None,
                execution_ended_at=job.ended_at,
            )
            job.cleanup(result_ttl, pipeline=pipe, remove_from_queue=False)
            ttl = result_ttl
            status = "finished"
        else:
            info["error"] = item.error
            job.set_status(JobStatus.FAILED, pipeline=pipe)
            job._handle_failure(
                item.traceback or item.error,
                pipe,
                worker_name=self.name,
                execution_id=item.execution.id if item.execution else None,
                execution_started_at=item.execution.created_at if item.execution else None,
                execution_ended_at=job.ended_at,
            )
            ttl = job.failure_ttl or self.settings.failure_ttl_s
            status = "failed"
        stored = {k: v for k, v in info.items() if k not in ("content_type",)}
        pipe.hset(keys.info_key(job.id), mapping=stored)
        pipe.expire(keys.info_key(job.id), ttl)
        if "webhook" in info:
            pipe.expire(keys.webhook_attempts_key(job.id), ttl)
            enqueue_webhook(self.queue_cache, self.settings, pipe, job.id)
        publish_event(pipe, job.id, model, status)


def _pairs(flat: list[bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2], strict=True)}


def _ms_between(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds() * 1000.0
