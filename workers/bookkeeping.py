"""RQ's bookkeeping for a whole batch, written straight into one pipeline.

RQ's per-job helpers build registry, result and serializer objects for every job and issue
about 27 commands each; at a few hundred jobs per batch that Python work, not Redis, is the
worker's ceiling. Here the same state -- the job hash fields, executions, the started,
finished and failed registries, the results stream -- is written with multi-member commands
where Redis allows them. Key names come from RQ's own classes, and the result entries from
``Result.serialize``, so ``rq info``, rq-dashboard and ``Job.fetch(...).return_value()``
read exactly what RQ itself would have written.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import uuid4

from redis.client import Pipeline
from rq.executions import Execution, ExecutionRegistry
from rq.job import JobStatus
from rq.queue import Queue
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.utils import current_timestamp, now, utcformat

from shared.rqjson import JSONJob


class QueueBook:
    """The registry keys of one queue, looked up once."""

    def __init__(self, queue: Queue) -> None:
        args: dict[str, Any] = {"connection": queue.connection, "job_class": JSONJob, "serializer": JSONSerializer}
        self.queue = queue
        self.started_key = StartedJobRegistry(queue.name, **args).key
        self.finished_key = FinishedJobRegistry(queue.name, **args).key
        self.failed_key = FailedJobRegistry(queue.name, **args).key
        self.intermediate_key = queue.intermediate_queue_key


def executions_key(job_id: str) -> str:
    return ExecutionRegistry.key_template.format(job_id)


def write_start(
    pipe: Pipeline, book: QueueBook, jobs: Sequence[JSONJob], worker_name: str, ttl_s: int, started_at: datetime
) -> list[Execution]:
    """What ``Execution.create`` and ``Job.prepare_for_execution`` write, for every job at once."""
    score = current_timestamp() + ttl_s
    stamp = utcformat(started_at)
    executions = []
    wip: dict[str, float] = {}
    for job in jobs:
        execution = Execution(uuid4().hex, job.id, job.connection, worker_name=worker_name)
        execution.created_at = execution.last_heartbeat = started_at
        executions.append(execution)
        pipe.hset(execution.key, mapping=execution.serialize())
        pipe.expire(execution.key, ttl_s)
        pipe.zadd(executions_key(job.id), {execution.id: score + 60})
        pipe.expire(executions_key(job.id), ttl_s + 60)
        wip[execution.composite_key] = score
        job.worker_name, job.started_at, job.last_heartbeat = worker_name, started_at, started_at
        job._status = JobStatus.STARTED
        pipe.hset(
            job.key,
            mapping={
                "last_heartbeat": stamp,
                "status": JobStatus.STARTED.value,
                "started_at": stamp,
                "worker_name": worker_name,
            },
        )
    if wip:
        pipe.zadd(book.started_key, wip)
    return executions


def write_success(
    pipe: Pipeline, job: JSONJob, execution: Execution | None, output: Any, ttl_s: int, worker_name: str
) -> None:
    """What ``Job._handle_success`` and ``Job.cleanup`` write for one finished job (registry excluded)."""
    _write_end(pipe, job, JobStatus.FINISHED, ttl_s)
    result = _result(job, execution, Result.Type.SUCCESSFUL, worker_name, return_value=output)
    _save_result(pipe, job.id, result, ttl_s)


def write_failure(
    pipe: Pipeline, job: JSONJob, execution: Execution | None, exc_string: str, ttl_s: int, worker_name: str
) -> None:
    """What ``Job._handle_failure`` writes for one failed job (registry excluded)."""
    _write_end(pipe, job, JobStatus.FAILED, ttl_s)
    result = _result(job, execution, Result.Type.FAILED, worker_name, exc_string=exc_string)
    _save_result(pipe, job.id, result, ttl_s)


def write_registries(
    pipe: Pipeline,
    book: QueueBook,
    executions: Sequence[Execution],
    finished: dict[str, int],
    failed: dict[str, int],
) -> None:
    """Leave the started registry; enter finished or failed with each job's TTL as score."""
    if executions:
        pipe.zrem(book.started_key, *(e.composite_key for e in executions))
        pipe.delete(*(e.key for e in executions))
        for execution in executions:
            pipe.zrem(executions_key(execution.job_id), execution.id)
    now_s = current_timestamp()
    if finished:
        pipe.zadd(book.finished_key, {job_id: now_s + ttl for job_id, ttl in finished.items()})
    if failed:
        pipe.zadd(book.failed_key, {job_id: now_s + ttl for job_id, ttl in failed.items()})


def _write_end(pipe: Pipeline, job: JSONJob, status: JobStatus, ttl_s: int) -> None:
    job._status = status
    assert job.ended_at is not None
    pipe.hset(job.key, mapping={"status": status.value, "ended_at": utcformat(job.ended_at)})
    pipe.expire(job.key, ttl_s)


def _result(job: JSONJob, execution: Execution | None, kind: Result.Type, worker_name: str, **values: Any) -> Result:
    result = Result.__new__(Result)  # skips RQ's per-object serializer resolution, the hot spot
    result.job_id, result.type, result.connection = job.id, kind, job.connection
    result.return_value = values.get("return_value")
    result.exc_string = values.get("exc_string")
    result.serializer = JSONSerializer
    result.worker_name = worker_name
    result.id, result.created_at = None, job.ended_at or now()
    result.execution_id = execution.id if execution else None
    result.execution_started_at = execution.created_at if execution else None
    result.execution_ended_at = job.ended_at
    return result


def _save_result(pipe: Pipeline, job_id: str, result: Result, ttl_s: int) -> None:
    key = Result.get_key(job_id)
    pipe.xadd(key, result.serialize(), maxlen=10)  # type: ignore[arg-type]
    pipe.expire(key, ttl_s)
