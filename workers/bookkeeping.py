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

import json
from collections.abc import Sequence
from dataclasses import dataclass
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


# Per job: HSET/EXPIRE the execution, add it to the job's executions and the started registry,
# mark the job started. ARGV: started key, score, ttl, job ttl, worker, stamp, timestamp, then
# five values per job. A job whose hash is gone (expired between pop and start, or Redis came back
# empty) is skipped, never re-created as a partial hash: its 1-based position is returned.
_START = """
local started, score, ttl, job_ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local worker, stamp, ts = ARGV[5], ARGV[6], ARGV[7]
local vanished = {}
for i = 8, #ARGV, 5 do
  local job_key, exec_key, execs_key, exec_id, composite = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4]
  if redis.call('HEXISTS', job_key, 'origin') == 0 then
    vanished[#vanished + 1] = (i - 8) / 5 + 1
  else
    redis.call('HSET', exec_key, 'id', exec_id, 'created_at', ts, 'last_heartbeat', ts, 'worker_name', worker)
    redis.call('EXPIRE', exec_key, ttl)
    redis.call('ZADD', execs_key, score + 60, exec_id)
    redis.call('EXPIRE', execs_key, ttl + 60)
    redis.call('ZADD', started, score, composite)
    redis.call('HSET', job_key, 'last_heartbeat', stamp, 'status', 'started', 'started_at', stamp,
               'worker_name', worker)
    redis.call('EXPIRE', job_key, job_ttl)
  end
end
return vanished
"""
# Per job (a JSON object): end the job, store its RQ result and inferq info, leave the started
# registry for finished/failed, drop the execution and the payload, publish the event last. A job
# whose hash is gone is not re-created: no result, no event, and its id is returned.
_FINISH = """
local started, finished, failed, now_s, channel = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local function flat(t)
  local out = {}
  for k, v in pairs(t) do out[#out + 1] = k; out[#out + 1] = v end
  return out
end
local vanished = {}
for i = 6, #ARGV do
  local j = cjson.decode(ARGV[i])
  if j.status and redis.call('HEXISTS', j.key, 'origin') == 0 then
    vanished[#vanished + 1] = j.id
    j.status, j.event = nil, nil
  end
  if j.status then
    redis.call('HSET', j.key, 'status', j.status, 'ended_at', j.ended_at)
    redis.call('EXPIRE', j.key, j.ttl)
    redis.call('XADD', j.result_key, 'MAXLEN', 10, '*', unpack(flat(j.result)))
    redis.call('EXPIRE', j.result_key, j.ttl)
    redis.call('ZADD', j.status == 'finished' and finished or failed, now_s + j.ttl, j.id)
    redis.call('HSET', j.info_key, unpack(flat(j.info)))
    redis.call('EXPIRE', j.info_key, j.ttl)
  end
  if j.exec_id then
    redis.call('ZREM', started, j.composite)
    redis.call('DEL', j.exec_key)
    redis.call('ZREM', j.execs_key, j.exec_id)
  end
  redis.call('DEL', j.payload_key)
  if j.event then redis.call('PUBLISH', channel, j.event) end
end
return vanished
"""


def write_start(
    pipe: Pipeline,
    book: QueueBook,
    jobs: Sequence[JSONJob],
    worker_name: str,
    ttl_s: int,
    started_at: datetime,
    job_ttl_s: int,
) -> list[Execution]:
    """What ``Execution.create`` and ``Job.prepare_for_execution`` write, for every job, in one script."""
    stamp = utcformat(started_at)
    args: list[Any] = [
        book.started_key,
        current_timestamp() + ttl_s,
        ttl_s,
        job_ttl_s,
        worker_name,
        stamp,
        repr(started_at.timestamp()),
    ]
    executions = []
    for job in jobs:
        execution = Execution(uuid4().hex, job.id, job.connection, worker_name=worker_name)
        execution.created_at = execution.last_heartbeat = started_at
        executions.append(execution)
        args += [job.key, execution.key, executions_key(job.id), execution.id, execution.composite_key]
        job.worker_name, job.started_at, job.last_heartbeat = worker_name, started_at, started_at
        job._status = JobStatus.STARTED
    if jobs:
        pipe.eval(_START, 0, *args)
    return executions


@dataclass(frozen=True)
class Outcome:
    """How one job ended, for the finish script."""

    status: str  # "finished" or "failed"
    value: Any  # the output, or the traceback
    ttl_s: int
    info_key: str
    info: dict[str, str]
    event: str


def end_entry(
    job: JSONJob, execution: Execution | None, payload_key: str, outcome: Outcome | None, worker_name: str
) -> str:
    """One job's part of the finish script; ``outcome`` None: drop it without a result (canceled)."""
    entry: dict[str, Any] = {"id": job.id, "payload_key": payload_key}
    if execution is not None:
        entry |= {
            "exec_id": execution.id,
            "exec_key": execution.key,
            "execs_key": executions_key(job.id),
            "composite": execution.composite_key,
        }
    if outcome is not None:
        finished = outcome.status == "finished"
        job._status = JobStatus.FINISHED if finished else JobStatus.FAILED
        kind = Result.Type.SUCCESSFUL if finished else Result.Type.FAILED
        values = {"return_value": outcome.value} if finished else {"exc_string": outcome.value}
        result = _result(job, execution, kind, worker_name, **values)
        assert job.ended_at is not None
        entry |= {
            "status": outcome.status,
            "key": job.key,
            "ended_at": utcformat(job.ended_at),
            "ttl": int(outcome.ttl_s),
            "result_key": Result.get_key(job.id),
            "result": {k: str(v) for k, v in result.serialize().items()},
            "info_key": outcome.info_key,
            "info": outcome.info,
            "event": outcome.event,
        }
    return json.dumps(entry, separators=(",", ":"))


def write_finish(pipe: Pipeline, book: QueueBook, channel: str, entries: Sequence[str]) -> None:
    """Every job of the batch ended, in one script."""
    if entries:
        pipe.eval(
            _FINISH,
            0,
            book.started_key,
            book.finished_key,
            book.failed_key,
            str(current_timestamp()),
            channel,
            *entries,
        )


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
