"""Every write that moves a job through its life: enqueue, claim, start, keep alive, finish (``finish``), cancel,
give back, and the announcement of ends that RQ itself wrote (failed by maintenance) or that nobody
wrote (expired in the queue).

Each step is one named script (``scripts``) over declared keys (``layout``), so each is atomic:
a cancel and a finish cannot both win, a vanished job is never re-created, and every end is told
exactly once -- one event on ``keys.EVENTS_CHANNEL`` and, when the job has one, one webhook.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any, cast
from uuid import uuid4

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.client import Pipeline
from rq.exceptions import DequeueTimeout
from rq.job import Retry
from rq.utils import current_timestamp, now, utcformat

from shared import durability, keys, metrics
from shared.errors import Conflict, InvalidInput, NotFound, QueueFull
from shared.lifecycle import layout, rqhash, scripts
from shared.lifecycle.layout import QueueKeys
from shared.lifecycle.lua import DIED_LINE_TAIL, EXPIRED_LINE_TAIL, told
from shared.settings import Settings

# How long an idle worker serving several models waits between claims, at most.
MULTI_QUEUE_POLL_S = 0.02
# How long an idle worker serving one model blocks on its interactive queue before it looks at the
# bulk lane again: the most an idle worker adds to a bulk job's wait.
BLOCK_SLICE_S = 0.5
_TERMINAL_RQ = {"finished": "finished", "failed": "failed", "stopped": "failed", "canceled": "canceled"}


def _template(settings: Settings) -> tuple[Any, ...]:
    return layout.delivery_template(settings.webhook_ttl_s, settings.webhook_timeout_s)


def metrics_args(at: float | None = None) -> list[Any]:
    """The scripts' metrics group: totals TTL, window TTL, failures kept, their TTL, now."""
    now_s = time.time() if at is None else at
    return [metrics.TOTALS_TTL_S, metrics.WINDOW_TTL_S, metrics.FAILURES_KEPT, metrics.FAILURES_TTL_S, repr(now_s)]


def metrics_keys(model: str, at: float | None = None) -> list[str]:
    """A model's metrics totals, its current window and its recent failures."""
    window = keys.metrics_window_key(model, metrics.window_start(at))
    return [keys.metrics_key(model), window, keys.metrics_failures_key(model)]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- the API's side -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Enqueued:
    """A queued job as the submit answer shows it."""

    id: str
    status: str  # RQ's status
    created_at: datetime | None
    # When it last entered its queue: a client's "queued since" (a retried job's is its requeue).
    enqueued_at: datetime | None


@dataclass(frozen=True)
class NewJob:
    """What ``enqueue`` writes for one job; ``shared.jobs`` builds it from a submission."""

    id: str
    model: str
    lane: str
    payload: bytes
    info: dict[str, Any]
    queue_ttl_s: int
    live_s: int
    info_ttl_s: int
    result_ttl_s: int
    failure_ttl_s: int
    timeout_s: int
    retries: int
    description: str
    max_queue_length: int
    idempotency: tuple[str, str] | None = None  # (key, "<job id> <fingerprint>")
    idempotency_ttl_s: int = 0


@lru_cache(maxsize=1024)
def job_template(
    queue_name: str,
    model: str,
    queue_ttl_s: int,
    result_ttl_s: int,
    failure_ttl_s: int,
    timeout_s: int,
    retries: int,
    description: str,
) -> tuple[Any, ...]:
    """RQ's job hash for these options, built once by RQ's own ``Job.to_dict()``, less its timestamps.

    Every field RQ reads stays what RQ itself writes (``rq info``, ``Job.fetch``, rq-dashboard); what
    differs between two jobs of the same options is only the job's key and its timestamps.
    """
    fields = layout.queued_job_fields(
        queue_name,
        layout.INFER_FUNC,
        kwargs={"model": model},
        ttl=queue_ttl_s,
        result_ttl=result_ttl_s,
        failure_ttl=failure_ttl_s,
        timeout=timeout_s,
        description=description,
        # RQ's abandoned-job cleanup requeues a dead worker's jobs while retries are left.
        retry=Retry(max=retries) if retries else None,
    )
    return tuple(value for pair in fields.items() for value in pair)


def _enqueue_call(new: NewJob) -> tuple[list[str], list[list[str]], list[Any], datetime]:
    """ENQUEUE's keys, per-item keys and arguments for ``new``, and the job's creation time."""
    queue_name = keys.queue_name(new.model, new.lane)
    template = job_template(
        queue_name,
        new.model,
        new.queue_ttl_s,
        new.result_ttl_s,
        new.failure_ttl_s,
        new.timeout_s,
        new.retries,
        new.description,
    )
    created_at = now()
    stamp = utcformat(created_at)
    info_flat = [value for pair in new.info.items() for value in pair]
    qk = layout.queue_keys(queue_name)
    idem_key, idem_value = new.idempotency or ("", "")
    fixed = [qk.queue, layout.QUEUES_SET, layout.job_key(new.id), keys.payload_key(new.id), keys.info_key(new.id)]
    args = [new.id, new.max_queue_length, idem_value, new.idempotency_ttl_s, new.payload, new.live_s]
    args += [new.info_ttl_s, new.queue_ttl_s, len(new.info), *info_flat, *template]
    args += ["created_at", stamp, "enqueued_at", stamp]
    return fixed, [[idem_key]] if idem_key else [], args, created_at


def enqueue(connection: Redis, new: NewJob) -> tuple[str, str, datetime | None]:
    """Write and queue the job in one atomic step: verdict "ok", "full" or "dup" (with the stored value)."""
    fixed, items, args, created_at = _enqueue_call(new)
    verdict, existing = scripts.ENQUEUE(connection, fixed, items, args)
    return _text(verdict), _text(existing), created_at


async def enqueue_async(connection: AsyncRedis, new: NewJob) -> tuple[str, str, datetime | None]:
    """``enqueue`` on the API's ``redis.asyncio`` client: the same script and arguments."""
    fixed, items, args, created_at = _enqueue_call(new)
    verdict, existing = await scripts.ENQUEUE.call_async(connection, fixed, items, args)
    return _text(verdict), _text(existing), created_at


_ENQUEUED_FIELDS = ["status", "created_at", "enqueued_at"]


def _enqueued(job_id: str, status: bytes | None, created: bytes | None, enqueued: bytes | None) -> Enqueued:
    if status is None:
        raise NotFound(f"the job {job_id} of this Idempotency-Key has expired")
    return Enqueued(job_id, status.decode(), rqhash.parse_stamp(created), rqhash.parse_stamp(enqueued))


def read_enqueued(connection: Redis, job_id: str) -> Enqueued:
    """An existing job as the submit answer shows it; NotFound once it expired."""
    status, created, enqueued = cast(list[bytes | None], connection.hmget(layout.job_key(job_id), _ENQUEUED_FIELDS))
    return _enqueued(job_id, status, created, enqueued)


async def read_enqueued_async(connection: AsyncRedis, job_id: str) -> Enqueued:
    """``read_enqueued`` on a ``redis.asyncio`` client."""
    reply = connection.hmget(layout.job_key(job_id), _ENQUEUED_FIELDS)
    status, created, enqueued = await cast(Awaitable[list[bytes | None]], reply)
    return _enqueued(job_id, status, created, enqueued)


def check_enqueued(verdict: str, existing: str, fingerprint: str, model: str) -> str | None:
    """The job id an Idempotency-Key already holds, or None for a new job; raises for a full queue or reuse."""
    if verdict == "full":
        raise QueueFull(f"the queue of model {model} is full; retry later")
    if verdict != "dup":
        return None
    other_id, _, stored = existing.partition(" ")
    if stored != fingerprint:
        raise InvalidInput("this Idempotency-Key was used with a different request body")
    return other_id


def cancel(connection: Redis, settings: Settings, job_id: str, owner: str | None = None) -> None:
    """Cancel a queued or started job; Conflict if it already ended, NotFound if unknown (or another's)."""
    if not keys.is_client_job(job_id):
        raise NotFound(f"no job {job_id!r}")
    hk = layout.hooks()
    for _ in range(5):
        origin = cast(bytes | None, connection.hget(layout.job_key(job_id), "origin"))
        if origin is None:
            raise NotFound(f"no job {job_id!r} (unknown, or its result expired)")
        qk = layout.queue_keys(origin.decode())
        job_keys = [layout.job_key(job_id), keys.info_key(job_id), keys.payload_key(job_id), qk.queue, qk.started]
        job_keys += [qk.canceled, layout.executions_key(job_id), keys.webhook_attempts_key(job_id)]
        job_keys += [layout.delivery_key(job_id), hk.queue, layout.QUEUES_SET]
        job_keys += metrics_keys(keys.model_from_queue(qk.name))[:2]
        reply, events = told(
            scripts.CANCEL(
                connection,
                job_keys,
                args=[job_id, owner or "", qk.name, settings.canceled_ttl_s, current_timestamp(), utcformat(now())]
                + [keys.EVENTS_CHANNEL, *metrics_args(), *_template(settings)],
                defer=durability.defers(settings),
            )
        )
        verdict = _text(reply[0])
        if verdict == "ok":
            durability.release(connection, settings, events)  # a cancel's 200 only once a replica has it
            return
        if verdict == "missing":
            raise NotFound(f"no job {job_id!r} (unknown, or its result expired)")
        if verdict == "conflict":
            raise Conflict(f"job {job_id} is already {_TERMINAL_RQ.get(_text(reply[1]), _text(reply[1]))}")
    raise Conflict(f"job {job_id} kept moving between queues; retry the cancel")


def announce_failed(connection: Redis, settings: Settings, job_ids: Sequence[str]) -> list[str]:
    """Publish ``failed`` and queue the webhook of jobs RQ's maintenance failed; each job is told once."""
    if not job_ids:
        return []
    hk = layout.hooks()
    # The model each job counts under (RQ's maintenance path, not a batch's: one more round trip is fine).
    with connection.pipeline(transaction=False) as pipe:
        for i in job_ids:
            pipe.hget(layout.job_key(i), "origin")
        origins = cast(list[bytes | None], pipe.execute())
    per_job = [
        [layout.job_key(i), keys.info_key(i), keys.webhook_attempts_key(i), layout.delivery_key(i)]
        + [keys.payload_key(i), *_batch_keys(i), *metrics_keys(keys.model_from_queue(_text(origin or b"")))]
        + [keys.waiting_items_key(_text(origin or b""))]
        for i, origin in zip(job_ids, origins, strict=True)
    ]
    failed, events = told(
        scripts.ANNOUNCE_FAILED(
            connection,
            [hk.queue, layout.QUEUES_SET],
            per_job,
            [settings.failure_ttl_s, utcformat(now()), keys.EVENTS_CHANNEL, DIED_LINE_TAIL, *metrics_args()]
            + [*_template(settings)]
            + list(job_ids),
            defer=durability.defers(settings),
        )
    )
    durability.release(connection, settings, events)
    return [_text(i) for i in failed]


# -- the worker's side --------------------------------------------------------------------------
def claim(
    connection: Redis, queue_names: Sequence[str], timeout: float | None, block_on: str | None = None
) -> tuple[str, str] | None:
    """Move the first waiting job of ``queue_names`` (tried in that order) into its intermediate list.

    Returns (job id, queue name); None when all are empty and ``timeout`` is None; DequeueTimeout when
    ``timeout`` passes. One script moves the job, so a worker killed at any moment leaves it in a list
    RQ's maintenance reads (RQ's own several-queue dequeue falls back to BLPOP, which leaves a popped
    job in no list). Redis cannot block on several lists and move atomically, so while all are empty:
    with ``block_on`` (a worker's one interactive queue) a blocking BLMOVE on it, woken at once by
    interactive work and returning every ``BLOCK_SLICE_S`` to look at the others; else a poll with a
    backoff of at most ``MULTI_QUEUE_POLL_S``.
    """
    pairs = [(layout.queue_keys(n).queue, layout.queue_keys(n).intermediate) for n in queue_names]
    deadline = time.monotonic() + (timeout or 0)
    pause_s = 0.001
    while True:
        found = scripts.CLAIM_FIRST(connection, [], pairs)
        if found:
            position, found_id = found
            return _text(found_id), queue_names[int(position) - 1]
        if timeout is None:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise DequeueTimeout(timeout, ",".join(p[0] for p in pairs))
        if block_on is not None:
            qk = layout.queue_keys(block_on)
            # Redis takes a fractional timeout; redis-py's annotation says int.
            slice_s: Any = max(0.01, min(left, BLOCK_SLICE_S))
            job_id = cast(bytes | None, connection.blmove(qk.queue, qk.intermediate, slice_s))
            if job_id is not None:
                return _text(job_id), block_on
            continue
        time.sleep(min(pause_s, left))
        pause_s = min(pause_s * 2, MULTI_QUEUE_POLL_S)


def any_waiting(connection: Redis, queue_names: Sequence[str]) -> bool:
    """Whether any of ``queue_names`` holds a job: an RQ queue's list exists only while it does."""
    return bool(connection.exists(*(layout.queue_keys(n).queue for n in queue_names)))


def pop(connection: Redis, qk: QueueKeys, want: int) -> list[str]:
    """Up to ``want`` more job IDs, moved into the intermediate list; it stops before a bulk chunk."""
    if want <= 0:
        return []
    args = [want, keys.CHUNK_PREFIX]
    return [_text(i) for i in scripts.POP(connection, [qk.queue, qk.intermediate], args=args)]


def read_inputs(connection: Redis, job_ids: Sequence[str]) -> list[tuple[bytes | None, str]]:
    """Popped jobs' inputs and content types, read ahead of their start (the worker's overlap): one round trip.

    Reading changes nothing; the start script still decides which of them run.
    """
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.get(keys.payload_key(job_id))
            pipe.hget(keys.info_key(job_id), "content_type")
        replies = pipe.execute()
    return [
        (payload or None, _text(content_type) if content_type else "")
        for payload, content_type in zip(replies[::2], replies[1::2], strict=True)
    ]


def _batch_keys(job_id: str) -> list[str]:
    """A chunk's batch record, result lines and webhook delivery; for a single job its info key, untouched."""
    if keys.is_chunk(job_id):
        batch_id = keys.batch_of_chunk(job_id)
        return [keys.batch_key(batch_id), keys.batch_results_key(batch_id), layout.delivery_key(batch_id)]
    return [keys.info_key(job_id)] * 3


@dataclass
class Claimed:
    """A started job, as its batch needs it."""

    id: str
    execution_id: str
    started_at: datetime
    enqueued_at: datetime | None
    timeout: int | None
    result_ttl: int | None
    failure_ttl: int | None
    payload: bytes | None
    info: dict[str, str]
    ended_at: datetime | None = None


@dataclass
class Started:
    """What the start script did with each popped job."""

    jobs: list[Claimed] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # canceled, or no longer queued
    vanished: list[str] = field(default_factory=list)  # the job hash is gone
    expired: list[str] = field(default_factory=list)  # gone after its queue deadline: announced
    events: list[bytes] = field(default_factory=list)  # the expiries' events, when they wait for a confirmation


@dataclass(frozen=True)
class StartCall:
    """A start queued in a pipeline: read its reply with ``started``."""

    position: int
    started_at: datetime
    execution_ids: list[str]


def start(
    pipe: Pipeline,
    settings: Settings,
    qk: QueueKeys,
    job_ids: Sequence[str],
    worker_name: str,
    heartbeat_ttl_s: int,
    job_ttl_s: int,
) -> StartCall:
    """Queue the start of a popped batch into ``pipe`` (the caller's transaction)."""
    started_at = now()
    model = keys.model_from_queue(qk.name)
    hk = layout.hooks()
    prefix = uuid4().hex[:24]  # 32 hex digits as RQ's, unique: a uuid4 per job cost more than its start
    execution_ids = [f"{prefix}{n:08x}" for n in range(len(job_ids))]
    per_job = [
        [
            layout.job_key(i),
            keys.info_key(i),
            keys.payload_key(i),
            layout.execution_key(i, e),
            layout.executions_key(i),
            keys.webhook_attempts_key(i),
            layout.delivery_key(i),
            *_batch_keys(i),
        ]
        for i, e in zip(job_ids, execution_ids, strict=True)
    ]
    args: list[Any] = [current_timestamp() + heartbeat_ttl_s, heartbeat_ttl_s, job_ttl_s, worker_name]
    args += [utcformat(started_at), repr(started_at.timestamp()), keys.EVENTS_CHANNEL, model, repr(time.time())]
    args += [EXPIRED_LINE_TAIL, *metrics_args(), *_template(settings)]
    for job_id, execution_id in zip(job_ids, execution_ids, strict=True):
        args += [job_id, execution_id]
    position = len(pipe)
    fixed = [qk.intermediate, qk.started, hk.queue, layout.QUEUES_SET, *metrics_keys(model)]
    scripts.START(pipe, fixed + [keys.waiting_items_key(qk.name)], per_job, args, defer=durability.defers(settings))
    return StartCall(position, started_at, execution_ids)


_START_FIELDS = ("status", "enqueued_at", "timeout", "result_ttl", "failure_ttl")


def started(call: StartCall, replies: list[Any]) -> Started:
    """The jobs a start queued with ``start`` began, and what became of the others."""
    rows, events = told(replies[call.position])
    out = Started(events=events)
    for row, execution_id in zip(rows, call.execution_ids, strict=True):
        job_id, state = _text(row[0]), _text(row[1])
        if state != "started":
            {"dropped": out.dropped, "vanished": out.vanished, "expired": out.expired}[state].append(job_id)
            continue
        raw = dict(zip(_START_FIELDS, row[2], strict=True))
        flat_info = row[4]
        info = {k.decode(): v.decode() for k, v in zip(flat_info[::2], flat_info[1::2], strict=True)}
        out.jobs.append(
            Claimed(
                id=job_id,
                execution_id=execution_id,
                started_at=call.started_at,
                enqueued_at=rqhash.parse_stamp(raw.get("enqueued_at")),
                timeout=_int(raw.get("timeout")),
                result_ttl=_int(raw.get("result_ttl")),
                failure_ttl=_int(raw.get("failure_ttl")),
                payload=row[3] or None,
                info=info,
            )
        )
    return out


def keep_alive(pipe: Pipeline, qk: QueueKeys, jobs: Sequence[Claimed], heartbeat_ttl_s: int, job_ttl_s: int) -> None:
    """While a batch runs: its executions stay in the started registry; the jobs outlive the run."""
    if not jobs:
        return
    score = current_timestamp() + heartbeat_ttl_s
    pipe.zadd(qk.started, {f"{j.id}:{j.execution_id}": score for j in jobs}, xx=True)
    for job in jobs:
        # EXPIRE never creates a key: a job canceled or expired meanwhile stays gone.
        pipe.expire(layout.execution_key(job.id, job.execution_id), heartbeat_ttl_s)
        pipe.expire(layout.job_key(job.id), job_ttl_s)
        pipe.expire(keys.info_key(job.id), job_ttl_s)
        pipe.expire(keys.payload_key(job.id), job_ttl_s)


def give_back(connection: Redis, qk: QueueKeys, jobs: Sequence[tuple[str, str]], worker_name: str) -> list[str]:
    """Started jobs, as (id, execution id), back at the front of their queue, queued again; the ids given back."""
    if not jobs:
        return []
    return [_text(i) for i in _give_back(connection, qk, jobs, worker_name)]


def _give_back(client: Any, qk: QueueKeys, jobs: Sequence[tuple[str, str]], worker_name: str) -> Any:
    per_job = [[layout.job_key(i), layout.execution_key(i, e), layout.executions_key(i)] for i, e in jobs]
    args: list[Any] = [worker_name]
    for job_id, execution_id in jobs:
        args += [job_id, execution_id]
    return scripts.GIVE_BACK(client, [qk.queue, qk.started], per_job, args)


def give_back_lost(
    connection: Redis, qk: QueueKeys, job_ids: Sequence[str], execution_ids: Sequence[str], worker_name: str
) -> list[str]:
    """A batch whose start lost its connection back at the front of its queue, whether the start ran or not.

    The start is one script: it ran (the jobs are started by this worker, with these executions) or it
    never did (they wait in the intermediate list, popped). One transaction gives back whichever holds.
    """
    with connection.pipeline(transaction=True) as pipe:
        if execution_ids:
            _give_back(pipe, qk, list(zip(job_ids, execution_ids, strict=True)), worker_name)
        scripts.GIVE_BACK_HELD(pipe, [qk.queue, qk.intermediate], args=list(job_ids))
        replies = pipe.execute()
    return [_text(i) for reply in replies for i in reply]


def give_back_held(connection: Redis, qk: QueueKeys, job_ids: Sequence[str]) -> list[str]:
    """Popped jobs that never started back at the front of their queue, in order."""
    if not job_ids:
        return []
    return [_text(i) for i in scripts.GIVE_BACK_HELD(connection, [qk.queue, qk.intermediate], args=list(job_ids))]


# Times a job popped but never started is put back (see scripts.RESCUE); after that RQ's cleanup retries or fails it.
RESCUE_LIMIT = 2


def rescue_stuck(connection: Redis, queue: Any) -> list[str]:
    """Jobs of ``queue`` popped but unstarted for over a minute, by RQ's count, back at the front in order."""
    stuck, qk = queue.intermediate_queue, layout.queue_keys(queue.name)
    back = []
    for job_id in reversed([i for i in stuck.get_job_ids() if stuck.should_be_cleaned_up(i)]):
        job_keys = [qk.intermediate, qk.queue, layout.job_key(job_id), keys.info_key(job_id)]
        if scripts.RESCUE(connection, [*job_keys, stuck.get_first_seen_key(job_id)], args=[job_id, RESCUE_LIMIT]):
            back.append(job_id)
    return back[::-1]


def _int(value: bytes | None) -> int | None:
    return int(value) if value else None
