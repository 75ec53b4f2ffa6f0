"""The API's side of a job's life: enqueue (one script: the input, inferq's info and RQ's job hash, or the job an
Idempotency-Key already made), read back what was enqueued, and cancel.

Each step is one named script (``scripts``) over declared keys (``layout``), so each is atomic: a cancel and a
finish cannot both win, a vanished job is never re-created, and every end is told exactly once -- one event on
``keys.EVENTS_CHANNEL`` and, when the job has one, one webhook. The worker's side: ``claims`` and ``finish``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from types import MappingProxyType
from typing import Any, cast

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.job import Retry
from rq.utils import current_timestamp, now, utcformat

from inferq.shared import durability, keys, metrics, tenants
from inferq.shared.errors import Conflict, InvalidInput, NotFound, QueueFull, QuotaExceeded, Unavailable
from inferq.shared.lifecycle import calls, layout, rqhash, scripts
from inferq.shared.lifecycle.lua import told
from inferq.shared.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Enqueued:
    """A queued job as the submit answer shows it."""

    id: str
    status: str  # RQ's status
    created_at: datetime | None
    # When it last entered its queue: a client's "queued since" (a retried job's is its requeue).
    enqueued_at: datetime | None
    # The version whose queue it is in, read for an Idempotency-Key's earlier job: routing may have sent its retry
    # elsewhere (None: the submit's own job, on the version it was routed to).
    version: int | None = None


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
    tenant: str = tenants.DEFAULT
    jobs_per_minute: int | None = None  # the tenant's quota (None: none)
    in_flight: int | None = None  # the tenant's quota of jobs not yet ended (None: none)
    # Several tenants: the job is queued in weighted fair order among them (lua/lib/fair.lua), by its weight.
    fair: bool = False
    weight: float = 1.0


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
) -> Mapping[str, Any]:
    """RQ's job hash for these options, built once by RQ's own ``Job.to_dict()``, less its timestamps (read-only:
    it is cached).

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
    return MappingProxyType(fields)


def _enqueue_call(new: NewJob) -> tuple[list[str], list[list[str]], dict[str, Any], datetime]:
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
    qk = layout.queue_keys(queue_name)
    idem_key, idem_value = new.idempotency or ("", "")
    fixed = [qk.queue, layout.QUEUES_SET, layout.job_key(new.id), keys.payload_key(new.id), keys.info_key(new.id)]
    fixed += [keys.tenant_rate_key(new.tenant), qk.fair_tags, qk.fair_state]
    fixed += [keys.tenant_in_flight_key(new.tenant), keys.metrics_key(new.model), qk.fair_backlog]
    fixed.append(keys.withdrawn_key(new.id))
    args = {
        "id": new.id,
        "max_length": new.max_queue_length,
        "idempotency": idem_value,
        "idempotency_ttl": new.idempotency_ttl_s,
        "per_minute": new.jobs_per_minute or 0,
        "in_flight_limit": new.in_flight or 0,
        "live_ms": new.live_s * 1000,
        "fair": "1" if new.fair else "0",
        "tenant": new.tenant,
        "cost": repr(1.0 / new.weight),
        "fair_window": layout.FAIR_WINDOW,
        "lane": new.lane,
        "totals_ttl": metrics.TOTALS_TTL_S,
        "info_ttl": new.info_ttl_s,
        "job_ttl": new.queue_ttl_s,
        "info": new.info,
        "job": {**template, "created_at": stamp, "enqueued_at": stamp},
    }
    return fixed, [[idem_key]] if idem_key else [], args, created_at


# A submit sent whose outcome is unknown: no answer in time (Redis slow, busy, paused), a connection lost with it in
# flight, or its write not confirmed (INFERQ_DURABILITY). A timeout is not a refusal: the script may have run, or may
# yet run once Redis reads it. Such a submit is withdrawn before its caller is told 503 (``WITHDRAW``).
_UNKNOWN = (RedisTimeoutError, RedisConnectionError, durability.NotConfirmed)


def _withdraw_call(new: NewJob) -> tuple[list[str], list[list[str]], dict[str, Any]]:
    qk = layout.queue_keys(keys.queue_name(new.model, new.lane))
    fixed = [keys.withdrawn_key(new.id), layout.job_key(new.id), keys.info_key(new.id), keys.payload_key(new.id)]
    fixed += [qk.queue, qk.fair_tags, qk.fair_backlog]
    fixed += [keys.tenant_in_flight_key(new.tenant), keys.metrics_key(new.model)]
    items = [[new.idempotency[0]]] if new.idempotency else []
    args = {"id": new.id, "ttl": keys.WITHDRAWN_TTL_S, "tenant": new.tenant, "lane": new.lane}
    return fixed, items, args


def enqueue(connection: Redis, new: NewJob) -> tuple[str, str, datetime | None]:
    """Write and queue the job in one atomic step: verdict "ok", "full" or "dup" (with the stored value).

    The input goes first, by a plain SET in the same pipeline (lua/enqueue.lua says why), then the script.
    A submit whose answer does not come is withdrawn (``_UNKNOWN``): the error is raised once nothing of it can
    stay (or, if its withdrawal gets no answer either, as it was), unless a worker already took its job: "ok"."""
    created_at: datetime | None = None
    try:
        with connection.pipeline(transaction=False) as pipe:
            created_at = queue_enqueue(pipe, new)
            stored, reply = pipe.execute(raise_on_error=False)
        verdict, existing = _verdict(stored, reply)
    except _UNKNOWN:
        try:
            taken = calls.text(scripts.WITHDRAW(connection, *_withdraw_call(new))) == "taken"
        except RedisError:
            taken = False
        if not taken:
            raise
        return "ok", "", created_at
    return verdict, existing, created_at


def queue_enqueue(pipe: Pipeline, new: NewJob) -> datetime:
    """``new``'s input and ENQUEUE queued on a synchronous pipeline that is not a transaction (many submits may share
    one); its replies are the SET's and the script's. Returns the job's creation time."""
    fixed, items, args, created_at = _enqueue_call(new)
    pipe.set(keys.payload_key(new.id), new.payload, ex=new.live_s)
    scripts.ENQUEUE(pipe, fixed, items, args)
    return created_at


async def enqueue_async(connection: AsyncRedis, new: NewJob) -> tuple[str, str, datetime | None]:
    """``enqueue`` on the API's ``redis.asyncio`` client: the same input, script and arguments, and the same
    withdrawal; one that gets no answer either is sent again in the background until Redis runs it
    (``withdrawing``)."""
    fixed, items, args, created_at = _enqueue_call(new)
    try:
        async with connection.pipeline(transaction=False) as pipe:
            pipe.set(keys.payload_key(new.id), new.payload, ex=new.live_s)
            scripts.ENQUEUE.queue_async(pipe, fixed, items, args)
            stored, reply = await pipe.execute(raise_on_error=False)
        if isinstance(reply, NoScriptError):  # a restarted or flushed server: EVAL caches it again
            reply = await scripts.ENQUEUE.eval_async(connection, fixed, items, args)
        verdict, existing = _verdict(stored, reply)
    except _UNKNOWN:
        call = _withdraw_call(new)
        try:
            taken = calls.text(await scripts.WITHDRAW.call_async(connection, *call)) == "taken"
        except durability.NotConfirmed:
            taken = False  # it ran, unconfirmed as the submit was
        except RedisError:
            withdrawing.add(asyncio.create_task(_withdraw_later(connection, new.id, call)))
            taken = False
        if not taken:
            raise
        return "ok", "", created_at
    return verdict, existing, created_at


def _verdict(stored: Any, reply: Any) -> tuple[str, str]:
    """ENQUEUE's verdict and detail from the replies of the input's SET and the script; either's error raised
    (the SET's first: a script that found no input says only "lost")."""
    for answer in (stored, reply):
        if isinstance(answer, Exception):
            raise answer
    verdict, existing = reply
    return calls.text(verdict), calls.text(existing)


# Withdrawals sent again in the background (a submit whose withdrawal got no answer in time either): the enqueue it
# follows may still be in a socket, or behind a stalled Redis, and runs when Redis reads it.
withdrawing: set[asyncio.Task[None]] = set()
WITHDRAW_RETRY_FOR_S = 60.0


async def _withdraw_later(connection: AsyncRedis, job_id: str, call: tuple[Any, ...]) -> None:
    pause_s = 0.05
    deadline = time.monotonic() + WITHDRAW_RETRY_FOR_S
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(pause_s)
            try:
                verdict = calls.text(await scripts.WITHDRAW.call_async(connection, *call))
            except durability.NotConfirmed:
                return  # it ran
            except RedisError:
                pause_s = min(pause_s * 2, 2.0)
                continue
            if verdict == "taken":  # in the moment between its late enqueue and this
                log.warning("submit %s: answered 503, yet its job stands (taken, or told to a retry)", job_id)
            return
        log.warning("submit %s: answered 503; Redis took no withdrawal in %g s", job_id, WITHDRAW_RETRY_FOR_S)
    finally:
        withdrawing.discard(asyncio.current_task())  # type: ignore[arg-type]


_ENQUEUED_FIELDS = ["status", "created_at", "enqueued_at", "origin"]


def _enqueued(
    job_id: str, status: bytes | None, created: bytes | None, enqueued: bytes | None, origin: bytes | None
) -> Enqueued:
    if status is None:
        raise NotFound(f"the job {job_id} of this Idempotency-Key has expired")
    version = keys.split_served(keys.model_from_queue(origin.decode()))[1] if origin else None
    return Enqueued(job_id, status.decode(), rqhash.parse_stamp(created), rqhash.parse_stamp(enqueued), version)


def read_enqueued(connection: Redis, job_id: str) -> Enqueued:
    """An existing job as the submit answer shows it; NotFound once it expired."""
    fields = cast(list[bytes | None], connection.hmget(layout.job_key(job_id), _ENQUEUED_FIELDS))
    return _enqueued(job_id, *fields)


async def read_enqueued_async(connection: AsyncRedis, job_id: str) -> Enqueued:
    """``read_enqueued`` on a ``redis.asyncio`` client."""
    reply = connection.hmget(layout.job_key(job_id), _ENQUEUED_FIELDS)
    return _enqueued(job_id, *await cast(Awaitable[list[bytes | None]], reply))


def check_enqueued(verdict: str, existing: str, fingerprint: str, model: str, tenant: str = "") -> str | None:
    """The job id an Idempotency-Key already holds, or None for a new job; raises for a full queue, a quota
    reached, or reuse."""
    if verdict == "full":
        raise QueueFull(f"the queue of model {model} is full; retry later")
    if verdict == "lost":  # its input's SET did not stand (lua/enqueue.lua): nothing was queued
        raise Unavailable("Redis did not keep this submit's input; nothing was queued: retry")
    if verdict == "withdrawn":  # its caller gave up on it before it ran: never the answer a waiting caller reads
        raise Unavailable("Redis did not answer this submit in time; it was withdrawn: retry")
    if verdict == "in_flight":
        raise QuotaExceeded(
            f"tenant {tenant} is over its quota in_flight: {existing} of its jobs have not ended; retry once some have",
            retry_after_s=1,
        )
    if verdict == "quota":
        retry_s = max(1, math.ceil(int(existing) / 1000))
        raise QuotaExceeded(
            f"tenant {tenant} is over its quota jobs_per_minute; retry in {retry_s} s", retry_after_s=retry_s
        )
    if verdict != "dup":
        return None
    other_id, _, stored = existing.partition(" ")
    stored = stored.removesuffix(" +")  # told to a retry already (lua/enqueue.lua)
    if stored != fingerprint:
        raise InvalidInput("this Idempotency-Key was used with a different request body")
    return other_id


def _cancel_call(settings: Settings, job_id: str, owner: str | None, origin: bytes) -> tuple[list[str], dict[str, Any]]:
    """CANCEL's keys and arguments for a job whose hash names ``origin`` as its queue."""
    qk = layout.queue_keys(origin.decode())
    hk = layout.hooks()
    job_keys = [layout.job_key(job_id), keys.info_key(job_id), keys.payload_key(job_id), qk.queue, qk.started]
    job_keys += [qk.canceled, keys.webhook_attempts_key(job_id)]
    job_keys += [layout.delivery_key(job_id), hk.queue, layout.QUEUES_SET]
    job_keys += calls.metrics_keys(keys.model_from_queue(qk.name))[:2]
    job_keys += [keys.attempt_key(job_id), qk.fair_tags, qk.fair_backlog]
    args = {
        "id": job_id,
        "owner": owner or "",
        "origin": qk.name,
        "ttl": settings.canceled_ttl_s,
        "now": current_timestamp(),
        "stamp": utcformat(now()),
        "channel": keys.EVENTS_CHANNEL,
        "metrics": calls.metrics_args(),
        "delivery": calls.delivery_args(settings),
    }
    return job_keys, args


def _cancel_verdict(job_id: str, reply: Any) -> bool:
    """True once canceled; False to read the job's queue again (it moved); raises NotFound or Conflict."""
    verdict = calls.text(reply[0])
    if verdict == "ok":
        return True
    if verdict == "missing":
        raise NotFound(f"no job {job_id!r} (unknown, or its result expired)")
    if verdict == "conflict":
        ended = calls.text(reply[1])
        raise Conflict(f"job {job_id} is already {calls.TERMINAL_RQ.get(ended, ended)}")
    return False


_CANCEL_TRIES = 5


def cancel(connection: Redis, settings: Settings, job_id: str, owner: str | None = None) -> None:
    """Cancel a queued or started job; Conflict if it already ended, NotFound if unknown (or another's)."""
    if not keys.is_client_job(job_id):
        raise NotFound(f"no job {job_id!r}")
    for _ in range(_CANCEL_TRIES):
        origin = cast(bytes | None, connection.hget(layout.job_key(job_id), "origin"))
        if origin is None:
            raise NotFound(f"no job {job_id!r} (unknown, or its result expired)")
        job_keys, args = _cancel_call(settings, job_id, owner, origin)
        reply, events = told(scripts.CANCEL(connection, job_keys, args=args, defer=durability.defers(settings)))
        if _cancel_verdict(job_id, reply):
            durability.release(connection, settings, events)  # a cancel's 200 only once a replica has it
            return
    raise Conflict(f"job {job_id} kept moving between queues; retry the cancel")


async def cancel_async(connection: AsyncRedis, settings: Settings, job_id: str, owner: str | None = None) -> None:
    """``cancel`` on the API's ``redis.asyncio`` client (its auto-pipeline confirms the writes, INFERQ_DURABILITY,
    before the script's reply comes back; the events it deferred are published after)."""
    if not keys.is_client_job(job_id):
        raise NotFound(f"no job {job_id!r}")
    for _ in range(_CANCEL_TRIES):
        origin = await cast(Awaitable[bytes | None], connection.hget(layout.job_key(job_id), "origin"))
        if origin is None:
            raise NotFound(f"no job {job_id!r} (unknown, or its result expired)")
        job_keys, args = _cancel_call(settings, job_id, owner, origin)
        defer = durability.defers(settings)
        reply, events = told(await scripts.CANCEL.call_async(connection, job_keys, args=args, defer=defer))
        if _cancel_verdict(job_id, reply):
            for event in events:
                await connection.publish(keys.EVENTS_CHANNEL, event)
            return
    raise Conflict(f"job {job_id} kept moving between queues; retry the cancel")
