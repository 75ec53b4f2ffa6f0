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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from redis import Redis
from redis.client import Pipeline
from rq.exceptions import DequeueTimeout
from rq.executions import Execution, ExecutionRegistry
from rq.job import JobStatus
from rq.queue import Queue
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.utils import current_timestamp, now, str_to_date, utcformat

from shared import keys
from shared.jobs import publish_event
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


# Pop up to ARGV[1] more IDs into RQ's intermediate list (so a worker killed right after the
# pop leaves them where RQ's maintenance finds them), then read every job of the batch --
# ARGV[2..] are IDs already popped -- with its payload and inferq info, in one round trip.
# LPOP with a count needs Redis >= 6.2.
POP_AND_LOAD = """
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
local want = tonumber(ARGV[1])
if want > 0 then
  local popped = redis.call('LPOP', KEYS[1], want)
  if popped then
    for _, id in ipairs(popped) do
      redis.call('RPUSH', KEYS[2], id)
      ids[#ids + 1] = id
    end
  end
end
local JOB_FIELDS = {'status', 'origin', 'enqueued_at', 'timeout', 'result_ttl', 'failure_ttl'}
local out = {}
for i, id in ipairs(ids) do
  out[i] = {id, redis.call('HMGET', KEYS[3] .. id, unpack(JOB_FIELDS)), redis.call('GET', KEYS[4] .. id) or false,
            redis.call('HGETALL', KEYS[5] .. id)}
end
return out
"""

# Several queues: move the first waiting job, trying KEYS pairwise (queue, its intermediate list) in order;
# returns {1-based pair position, job id} or false. LMOVE needs Redis >= 6.2.
CLAIM_FIRST = """
for i = 1, #KEYS, 2 do
  local id = redis.call('LMOVE', KEYS[i], KEYS[i + 1], 'LEFT', 'RIGHT')
  if id then return {(i + 1) / 2, id} end
end
return false
"""
# How long an idle worker serving several queues waits between claims, at most.
MULTI_QUEUE_POLL_S = 0.02

# Server-side loops: one command for what would be one command per job.
CANCEL_FLAGS = """
local out = {}
for i, k in ipairs(KEYS) do out[i] = redis.call('HGET', k, 'canceled') or false end
return out
"""
LREM_MANY = """
for i = 1, #ARGV do redis.call('LREM', KEYS[1], 1, ARGV[i]) end
return #ARGV
"""
PUBLISH_MANY = """
for i = 2, #ARGV do redis.call('PUBLISH', ARGV[1], ARGV[i]) end
return #ARGV - 1
"""


# The job hash fields a batch reads (the order POP_AND_LOAD's JOB_FIELDS returns them in).
JOB_FIELDS = (b"status", b"origin", b"enqueued_at", b"timeout", b"result_ttl", b"failure_ttl")


def queued_job(job_id: str, raw: dict[bytes, bytes | None], connection: Redis) -> JSONJob:
    """The fields of a queued job the batch needs; RQ's full restore() costs more than the model."""
    job = JSONJob(job_id, connection=connection)
    job._status = JobStatus.QUEUED
    job.origin = (raw.get(b"origin") or b"").decode()
    job.enqueued_at = _parse_time(raw.get(b"enqueued_at"))
    job.timeout = _int(raw.get(b"timeout"))
    job.result_ttl = _int(raw.get(b"result_ttl"))
    job.failure_ttl = _int(raw.get(b"failure_ttl"))
    return job


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: bytes | None) -> int | None:
    return int(value) if value else None


def _parse_time(value: bytes | None) -> datetime | None:
    if not value:
        return None
    try:  # RQ's format, read without strptime (which cost more than the model here)
        return datetime.fromisoformat(value.decode().rstrip("Z")).replace(tzinfo=UTC)
    except ValueError:
        return str_to_date(value)


def run_script(client: Any, script: str, script_keys: list[str], args: list[Any] | None = None) -> Any:
    # Plain EVAL: redis-py's Script objects add a SCRIPT EXISTS round trip to every pipeline.
    return client.eval(script, len(script_keys), *script_keys, *(args or []))


def pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def ms_between(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds() * 1000.0


def claim_next(connection: Redis, queues: list[Queue], turn: int, timeout: int | None) -> tuple[str, Queue] | None:
    """Move the next job into its queue's intermediate list in one step; None when empty and ``timeout`` is None.

    One queue: RQ's own blocking BLMOVE. Several (RQ would fall back to BLPOP, and a job popped by a
    worker that dies before it registers is lost): one script moves the first waiting job of the
    queues, starting at ``turn`` so each model gets its turn, polled with a short backoff while all
    are empty (Redis has no blocking move from several lists).
    """
    if len(queues) == 1:
        queue = queues[0]
        job_id: Any
        if timeout is None:
            job_id = connection.lmove(queue.key, queue.intermediate_queue_key)
        else:
            job_id = connection.blmove(queue.key, queue.intermediate_queue_key, timeout)
            if job_id is None:
                raise DequeueTimeout(timeout, queue.key)
        return (text(job_id), queue) if job_id is not None else None
    turn %= len(queues)
    order = queues[turn:] + queues[:turn]
    script_keys = [key for q in order for key in (q.key, q.intermediate_queue_key)]
    deadline = time.monotonic() + (timeout or 0)
    pause_s = 0.001
    while True:
        found = run_script(connection, CLAIM_FIRST, script_keys)
        if found:
            position, found_id = found
            return text(found_id), order[int(position) - 1]
        if timeout is None:
            return None
        if time.monotonic() >= deadline:
            raise DequeueTimeout(timeout, ",".join(q.key for q in order))
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, MULTI_QUEUE_POLL_S)


def give_back(connection: Redis, book: QueueBook, jobs: Sequence[JSONJob], executions: Sequence[Execution]) -> None:
    """Started jobs back at the front of their queue, queued again, as they were."""
    with connection.pipeline(transaction=True) as pipe:
        write_registries(pipe, book, executions, {}, {})
        for job in jobs:
            job.set_status(JobStatus.QUEUED, pipeline=pipe)
        pipe.lpush(book.queue.key, *(job.id for job in reversed(jobs)))
        pipe.execute()


def give_back_held(connection: Redis, queue: Queue, job_ids: list[str]) -> None:
    """Popped jobs that never started, out of the intermediate list and back at the queue's front, in order."""
    with connection.pipeline(transaction=True) as pipe:
        run_script(pipe, LREM_MANY, [queue.intermediate_queue_key], job_ids)
        pipe.lpush(queue.key, *reversed(job_ids))
        pipe.execute()


def restore_canceled(
    connection: Redis, book: QueueBook, jobs: Sequence[JSONJob], executions: Sequence[Execution], ttl_s: int
) -> None:
    """Undo a worker's writes for jobs canceled while it held them: canceled wins, and is told."""
    model = keys.model_from_queue(book.queue.name)
    with connection.pipeline(transaction=True) as pipe:
        write_registries(pipe, book, executions, {}, {})
        for job in jobs:
            job.set_status(JobStatus.CANCELED, pipeline=pipe)
            pipe.delete(Result.get_key(job.id))
            pipe.zrem(book.finished_key, job.id)
            pipe.zrem(book.failed_key, job.id)
            pipe.expire(job.key, ttl_s)
            pipe.expire(keys.info_key(job.id), ttl_s)
            publish_event(pipe, job.id, model, "canceled")
        pipe.execute()
