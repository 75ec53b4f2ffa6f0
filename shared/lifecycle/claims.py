"""The worker's side of a job's life, up to its finish (``finish``): claim the first waiting job of its lanes, pop
more for the batch, start them, keep them alive, give back what it will not run, rescue what a dead worker
stranded, and announce the ends RQ's own maintenance wrote (failed when a worker died).

Each step is one named script (``scripts``) over declared keys (``layout``), so each is atomic. The API's side:
``submit``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast
from uuid import uuid4

from redis import Redis
from redis.client import Pipeline
from rq.exceptions import DequeueTimeout
from rq.utils import current_timestamp, now, utcformat

from inferq.shared import durability, keys
from inferq.shared.lifecycle import calls, layout, rqhash, scripts
from inferq.shared.lifecycle.info import F
from inferq.shared.lifecycle.layout import QueueKeys
from inferq.shared.lifecycle.lua import DIED_LINE_TAIL, EXPIRED_LINE_TAIL, told
from inferq.shared.settings import Settings

# How long an idle worker serving several models waits between claims, at most.
MULTI_QUEUE_POLL_S = 0.02
# How long an idle worker serving one model blocks on its interactive queue before it looks at the
# bulk lane again: the most an idle worker adds to a bulk job's wait.
BLOCK_SLICE_S = 0.5


def running_job_ttl_s(settings: Settings) -> int:
    """How long a started job's hash, input and info live (the start's TTL; the keep-alive extends them while its
    batch runs): its timeout, a heartbeat's lapse, then as long as a failure is kept."""
    return settings.job_timeout_s + settings.heartbeat_ttl_s + settings.failure_ttl_s


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
    queues = [calls.text(origin or b"") for origin in origins]
    per_job = [
        [layout.job_key(i), keys.info_key(i), keys.webhook_attempts_key(i), layout.delivery_key(i)]
        + [keys.payload_key(i), *calls.batch_keys(i), *calls.metrics_keys(keys.model_from_queue(queue))]
        + [keys.waiting_items_key(queue), keys.attempt_key(i)]
        for i, queue in zip(job_ids, queues, strict=True)
    ]
    failed, events = told(
        scripts.ANNOUNCE_FAILED(
            connection,
            [hk.queue, layout.QUEUES_SET],
            per_job,
            {
                "ttl": settings.failure_ttl_s,
                "stamp": utcformat(now()),
                "channel": keys.EVENTS_CHANNEL,
                "died_tail": DIED_LINE_TAIL,
                "metrics": calls.metrics_args(),
                "delivery": calls.delivery_args(settings),
                "ids": job_ids,
            },
            defer=durability.defers(settings),
        )
    )
    durability.release(connection, settings, events)
    return [calls.text(i) for i in failed]


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
    each = [layout.queue_keys(n) for n in queue_names]
    quads = [(qk.queue, qk.intermediate, qk.fair_tags, qk.fair_backlog) for qk in each]
    args = {"window": layout.FAIR_WINDOW}
    deadline = time.monotonic() + (timeout or 0)
    pause_s = 0.001
    while True:
        found = scripts.CLAIM_FIRST(connection, [], quads, args)
        if found:
            position, found_id = found
            return calls.text(found_id), queue_names[int(position) - 1]
        if timeout is None:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise DequeueTimeout(timeout, ",".join(qk.queue for qk in each))
        if block_on is not None:
            qk = layout.queue_keys(block_on)
            # Redis takes a fractional timeout; redis-py's annotation says int.
            slice_s: Any = max(0.01, min(left, BLOCK_SLICE_S))
            job_id = cast(bytes | None, connection.blmove(qk.queue, qk.intermediate, slice_s))
            if job_id is not None:
                return calls.text(job_id), block_on
            continue
        time.sleep(min(pause_s, left))
        pause_s = min(pause_s * 2, MULTI_QUEUE_POLL_S)


def any_waiting(connection: Redis, queue_names: Sequence[str]) -> bool:
    """Whether any of ``queue_names`` holds a job: an RQ queue's list (or its fair backlog) exists only while it
    does."""
    each = [layout.queue_keys(n) for n in queue_names]
    return bool(connection.exists(*(qk.queue for qk in each), *(qk.fair_backlog for qk in each)))


def any_started(connection: Redis, queue_names: Sequence[str]) -> bool:
    """Whether any of ``queue_names`` has a job in its started registry: running, or held by a worker that died until
    RQ's maintenance gives it back (once its heartbeat lapses)."""
    with connection.pipeline(transaction=False) as pipe:
        for name in queue_names:
            pipe.zcard(layout.queue_keys(name).started)
        return any(int(n) for n in pipe.execute())


def pop(connection: Redis, qk: QueueKeys, want: int) -> list[str]:
    """Up to ``want`` more job IDs, moved into the intermediate list; it stops before a bulk chunk."""
    if want <= 0:
        return []
    args = {"want": want, "stop": keys.CHUNK_PREFIX, "window": layout.FAIR_WINDOW}
    fixed = [qk.queue, qk.intermediate, qk.fair_tags, qk.fair_backlog]
    return [calls.text(i) for i in scripts.POP(connection, fixed, args=args)]


def read_inputs(connection: Redis, job_ids: Sequence[str]) -> list[tuple[bytes | None, str]]:
    """Popped jobs' inputs and content types, read ahead of their start (the worker's overlap): one round trip of
    two commands, an MGET and FIELD_OF_EACH (a GET and an HGET per job cost the worker's client about 5 us a job).

    Reading changes nothing; the start script still decides which of them run.
    """
    if not job_ids:
        return []
    with connection.pipeline(transaction=False) as pipe:
        pipe.mget([keys.payload_key(job_id) for job_id in job_ids])
        scripts.FIELD_OF_EACH(pipe, [], [[keys.info_key(job_id)] for job_id in job_ids], {"field": F.CONTENT_TYPE})
        payloads, content_types = pipe.execute()
    return [
        (payload or None, calls.text(content_type) if content_type else "")
        for payload, content_type in zip(payloads, content_types, strict=True)
    ]


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
    *,
    inputs: bool = True,
) -> StartCall:
    """Queue the start of a popped batch into ``pipe`` (the caller's transaction); ``inputs``: whether its reply
    carries the started jobs' inputs (not when the worker read them ahead: ``read_inputs``)."""
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
            keys.webhook_attempts_key(i),
            layout.delivery_key(i),
            *calls.batch_keys(i),
            keys.attempt_key(i),
        ]
        for i in job_ids
    ]
    args = {
        "score": current_timestamp() + heartbeat_ttl_s,
        "job_ttl": job_ttl_s,
        "worker": worker_name,
        "stamp": utcformat(started_at),
        "channel": keys.EVENTS_CHANNEL,
        "model": model,
        "now": repr(time.time()),
        "expired_tail": EXPIRED_LINE_TAIL,
        "inputs": "1" if inputs else "0",
        "metrics": calls.metrics_args(),
        "delivery": calls.delivery_args(settings),
        "jobs": list(zip(job_ids, execution_ids, strict=True)),
    }
    position = len(pipe)
    fixed = [qk.intermediate, qk.started, hk.queue, layout.QUEUES_SET, *calls.metrics_keys(model)]
    scripts.START(pipe, fixed + [keys.waiting_items_key(qk.name)], per_job, args, defer=durability.defers(settings))
    return StartCall(position, started_at, execution_ids)


_START_FIELDS = ("status", "enqueued_at", "timeout", "result_ttl", "failure_ttl")


def started(call: StartCall, replies: list[Any]) -> Started:
    """The jobs a start queued with ``start`` began, and what became of the others."""
    rows, events = told(replies[call.position])
    out = Started(events=events)
    for row, execution_id in zip(rows, call.execution_ids, strict=True):
        job_id, state = calls.text(row[0]), calls.text(row[1])
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
                timeout=calls.int_or_none(raw.get("timeout")),
                result_ttl=calls.int_or_none(raw.get("result_ttl")),
                failure_ttl=calls.int_or_none(raw.get("failure_ttl")),
                payload=row[3] or None,
                info=info,
            )
        )
    return out


def keep_alive(pipe: Pipeline, qk: QueueKeys, jobs: Sequence[Claimed], heartbeat_ttl_s: int, job_ttl_s: int) -> None:
    """While a batch runs: its jobs stay in the started registry; the jobs outlive the run."""
    if not jobs:
        return
    score = current_timestamp() + heartbeat_ttl_s
    pipe.zadd(qk.started, {f"{j.id}:{j.execution_id}": score for j in jobs}, xx=True)
    for job in jobs:
        # EXPIRE never creates a key: a job canceled or expired meanwhile stays gone.
        pipe.expire(layout.job_key(job.id), job_ttl_s)
        pipe.expire(keys.info_key(job.id), job_ttl_s)
        pipe.expire(keys.payload_key(job.id), job_ttl_s)


def give_back(connection: Redis, qk: QueueKeys, jobs: Sequence[tuple[str, str]], worker_name: str) -> list[str]:
    """Started jobs, as (id, execution id), back at the front of their queue, queued again; the ids given back."""
    if not jobs:
        return []
    return [calls.text(i) for i in _give_back(connection, qk, jobs, worker_name)]


def _give_back(client: Any, qk: QueueKeys, jobs: Sequence[tuple[str, str]], worker_name: str) -> Any:
    per_job = [[layout.job_key(i)] for i, _ in jobs]
    return scripts.GIVE_BACK(client, [qk.queue, qk.started], per_job, {"worker": worker_name, "jobs": jobs})


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
        scripts.GIVE_BACK_HELD(pipe, [qk.queue, qk.intermediate], args={"ids": job_ids})
        replies = pipe.execute()
    return [calls.text(i) for reply in replies for i in reply]


def give_back_held(connection: Redis, qk: QueueKeys, job_ids: Sequence[str]) -> list[str]:
    """Popped jobs that never started back at the front of their queue, in order."""
    if not job_ids:
        return []
    back = scripts.GIVE_BACK_HELD(connection, [qk.queue, qk.intermediate], args={"ids": job_ids})
    return [calls.text(i) for i in back]


# Times a job popped but never started is put back (see scripts.RESCUE); after that RQ's cleanup retries or fails it.
RESCUE_LIMIT = 2


def rescue_stuck(connection: Redis, queue: Any) -> list[str]:
    """Jobs of ``queue`` popped but unstarted for over a minute, by RQ's count, back at the front in order."""
    stuck, qk = queue.intermediate_queue, layout.queue_keys(queue.name)
    back = []
    for job_id in reversed([i for i in stuck.get_job_ids() if stuck.should_be_cleaned_up(i)]):
        job_keys = [qk.intermediate, qk.queue, layout.job_key(job_id), keys.info_key(job_id)]
        if scripts.RESCUE(
            connection, [*job_keys, stuck.get_first_seen_key(job_id)], args={"id": job_id, "limit": RESCUE_LIMIT}
        ):
            back.append(job_id)
    return back[::-1]
