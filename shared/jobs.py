"""The job contract both sides share: enqueue, read a job's view, cancel, publish events."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import orjson
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline

from inferq.shared import keys, tenants
from inferq.shared.errors import NotFound
from inferq.shared.lifecycle import layout, rqhash, submit
from inferq.shared.lifecycle.info import JobInfo, at_submit
from inferq.shared.rqjson import JSONQueue
from inferq.shared.settings import Settings
from inferq.shared.view import encode_fields

TERMINAL = ("finished", "failed", "canceled", "expired")
# RQ statuses a client never needs to tell apart.
_STATUS_MAP = {
    "created": "queued",
    "deferred": "queued",
    "scheduled": "queued",
    "queued": "queued",
    "started": "started",
    "finished": "finished",
    "failed": "failed",
    "stopped": "failed",
    "canceled": "canceled",
}


def new_job_id() -> str:
    """An unguessable job ID matching RQ's ``[A-Za-z0-9_-]+``, never one a chunk or a webhook delivery could have."""
    while True:
        job_id = secrets.token_urlsafe(18)
        if keys.is_client_job(job_id):
            return job_id


def public_status(rq_status: str | None) -> str:
    """The status a client sees for an RQ status."""
    return _STATUS_MAP.get(rq_status or "", "queued")


def utcnow() -> datetime:
    return datetime.now(UTC)


def isoformat(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.isoformat().replace("+00:00", "Z")


def event_message(job_id: str, model: str, status: str, **extra: Any) -> str:
    """The JSON event published on ``keys.EVENTS_CHANNEL``."""
    return json.dumps({"id": job_id, "model": model, "status": status, **extra})


def publish_event(pipe: Pipeline | Redis, job_id: str, model: str, status: str, **extra: Any) -> None:
    pipe.publish(keys.EVENTS_CHANNEL, event_message(job_id, model, status, **extra))


class QueueCache:
    """One RQ Queue object per name, so RQ's cached server version costs one INFO per process."""

    def __init__(self, connection: Redis) -> None:
        self.connection = connection
        self._queues: dict[str, JSONQueue] = {}

    def get(self, name: str) -> JSONQueue:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = JSONQueue(name, connection=self.connection)
        return queue


@dataclass(frozen=True)
class Submission:
    """What the API hands to ``enqueue_job`` after validating the request."""

    model: str
    payload: bytes
    content_type: str
    webhook: str | None = None
    result_ttl_s: int | None = None
    # Times the job is run again if the worker running it dies; None: the settings' default.
    retries: int | None = None
    # Seconds the job may wait in its queue; past that it never runs and reads as expired.
    queue_ttl_s: int | None = None
    max_queue_length: int | None = None
    idempotency_key: str | None = None
    # The version the client pinned (``?version=``, a /v2 path's), or None: its Idempotency-Key's fingerprint holds
    # that, never the version routing chose (a retry of an unpinned submit may be routed to another).
    pinned: int | None = None
    # Who submitted it (a hash of the API key), so only they can see or cancel it.
    owner: str | None = None
    # The model's queue it waits in: interactive work goes first, bulk fills in (keys.LANES).
    lane: str = keys.INTERACTIVE
    # Whose key sent it, and that tenant's jobs-per-minute quota (None: none).
    tenant: str = tenants.DEFAULT
    jobs_per_minute: int | None = None
    in_flight: int | None = None  # its quota of jobs not yet ended
    # Whether the deployment has several tenants (its jobs are then queued in weighted fair order), and this one's
    # weight.
    fair: bool = False
    weight: float = 1.0
    # Tracing on: the submit span's context (``traceparent``, ``tracestate``), stored with the job.
    trace: Mapping[str, str] | None = None

    @property
    def fingerprint(self) -> str:
        """What an Idempotency-Key's request must match: the input and every option the client chose."""
        # The options too: else a retry with another webhook got the old job and its webhook was
        # silently dropped. Retries, queue limit and owner come from the server, not the body.
        name = keys.split_served(self.model)[0]
        options: list[Any] = [name, self.content_type, self.webhook, self.result_ttl_s, self.queue_ttl_s]
        if self.lane != keys.INTERACTIVE:  # so keys stored before lanes existed still match
            options.append(self.lane)
        if self.pinned is not None:
            options.append({"version": self.pinned})
        # JSON escapes control characters: the NUL after it separates the two unambiguously.
        return hashlib.sha256(json.dumps(options).encode() + b"\0" + self.payload).hexdigest()


def _new_job(
    settings: Settings, submission: Submission, job_id: str | None = None, waited: bool = False
) -> submit.NewJob:
    """What ``submit.enqueue`` writes for ``submission``: one place, so the sync and async submits agree.

    ``waited``: a request waits for its end, so the worker publishes its view with the end (``ended_view``).
    """
    job_id = job_id or new_job_id()
    result_ttl_s = submission.result_ttl_s or settings.result_ttl_s
    queue_ttl_s = submission.queue_ttl_s or settings.queue_ttl_s
    # The payload and info must outlive the wait in the queue plus the run.
    live_s = queue_ttl_s + settings.job_timeout_s + 60
    info = at_submit(
        submission.model,
        submission.content_type,
        time.time() + queue_ttl_s,
        submission.webhook,
        submission.owner,
        waited,
        submission.tenant if submission.tenant != tenants.DEFAULT else None,
        submission.trace,
    )
    idempotency = None
    if submission.idempotency_key:
        key = keys.idempotency_key(submission.owner or "", submission.idempotency_key)
        idempotency = (key, f"{job_id} {submission.fingerprint}")
    return submit.NewJob(
        id=job_id,
        model=submission.model,
        lane=submission.lane,
        payload=submission.payload,
        info=info,
        queue_ttl_s=queue_ttl_s,
        live_s=live_s,
        info_ttl_s=live_s + max(result_ttl_s, settings.failure_ttl_s),
        result_ttl_s=result_ttl_s,
        failure_ttl_s=settings.failure_ttl_s,
        timeout_s=settings.job_timeout_s,
        retries=settings.job_retries if submission.retries is None else submission.retries,
        description=f"{submission.model} inference",
        max_queue_length=submission.max_queue_length or settings.max_queue_length,
        idempotency=idempotency,
        idempotency_ttl_s=settings.idempotency_ttl_s,
        tenant=submission.tenant,
        jobs_per_minute=submission.jobs_per_minute,
        in_flight=submission.in_flight,
        fair=submission.fair,
        weight=submission.weight,
    )


def _existing(verdict: str, existing: str, submission: Submission) -> str | None:
    # The fingerprint hashes the whole input: only a duplicate Idempotency-Key needs it.
    fingerprint = submission.fingerprint if verdict == "dup" else ""
    return submit.check_enqueued(verdict, existing, fingerprint, submission.model, submission.tenant)


# A tenant's in-flight count (lua/enqueue.lua) drops a job only once it has surely ended. At its quota, the API
# looks which of the counted jobs ended sooner (finished, failed, canceled, expired) and drops them, then tries
# once more: at most once a second per tenant and process, so refused submits stay cheap.
_RQ_ENDED = frozenset({b"finished", b"failed", b"stopped", b"canceled"})
REPAIR_EVERY_S = 1.0
_repaired_at: dict[str, float] = {}


def _repair_due(tenant: str) -> bool:
    now = time.monotonic()
    if now - _repaired_at.get(tenant, -REPAIR_EVERY_S) < REPAIR_EVERY_S:
        return False
    _repaired_at[tenant] = now
    return True


def _ended(ids: list[bytes], statuses: list[bytes | None]) -> list[bytes]:
    return [i for i, status in zip(ids, statuses, strict=True) if status is None or status in _RQ_ENDED]


def drop_ended_in_flight(connection: Redis, tenant: str) -> int:
    """Drop the jobs of ``tenant``'s in-flight count that have ended: how many."""
    key = keys.tenant_in_flight_key(tenant)
    ids = cast(list[bytes], connection.zrange(key, 0, -1))
    with connection.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hget(layout.job_key(job_id.decode()), "status")
        ended = _ended(ids, pipe.execute())
    return int(cast(int, connection.zrem(key, *ended))) if ended else 0


async def drop_ended_in_flight_async(connection: AsyncRedis, tenant: str) -> int:
    """``drop_ended_in_flight`` on the API's ``redis.asyncio`` client."""
    key = keys.tenant_in_flight_key(tenant)
    ids = cast(list[bytes], await connection.zrange(key, 0, -1))
    async with connection.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hget(layout.job_key(job_id.decode()), "status")
        ended = _ended(ids, await pipe.execute())
    return int(await connection.zrem(key, *ended)) if ended else 0


def enqueue_job(queues: QueueCache, settings: Settings, submission: Submission) -> submit.Enqueued:
    """Store the payload and enqueue a real RQ job, atomically and in one round trip."""
    new = _new_job(settings, submission)
    verdict, existing, created_at = submit.enqueue(queues.connection, new)
    if verdict == "in_flight" and _repair_due(new.tenant) and drop_ended_in_flight(queues.connection, new.tenant):
        verdict, existing, created_at = submit.enqueue(queues.connection, new)
    other_id = _existing(verdict, existing, submission)
    if other_id is not None:
        return submit.read_enqueued(queues.connection, other_id)
    return submit.Enqueued(new.id, "queued", created_at, created_at)  # one stamp, as ENQUEUE writes both


async def enqueue_job_async(
    connection: AsyncRedis,
    settings: Settings,
    submission: Submission,
    job_id: str | None = None,
    *,
    waited: bool = False,
) -> submit.Enqueued:
    """``enqueue_job`` on the API's ``redis.asyncio`` client: no thread per submit.

    ``job_id`` (from ``new_job_id``) lets a caller subscribe to the job's events before it exists;
    ``waited``: the caller waits for its end (``_new_job``).
    """
    new = _new_job(settings, submission, job_id, waited)
    verdict, existing, created_at = await submit.enqueue_async(connection, new)
    if verdict == "in_flight" and _repair_due(new.tenant) and await drop_ended_in_flight_async(connection, new.tenant):
        verdict, existing, created_at = await submit.enqueue_async(connection, new)
    other_id = _existing(verdict, existing, submission)
    if other_id is not None:
        return await submit.read_enqueued_async(connection, other_id)
    return submit.Enqueued(new.id, "queued", created_at, created_at)  # one stamp, as ENQUEUE writes both


def _decode_hash(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


def _queue_view_reads(pipe: Pipeline | AsyncPipeline, job_id: str) -> None:
    """The reads a job's view is made of, queued in one pipeline (sync or async): one round trip."""
    if not keys.is_client_job(job_id):
        raise NotFound(f"no job {job_id!r}")
    pipe.hgetall(layout.job_key(job_id))
    pipe.pttl(layout.job_key(job_id))
    pipe.hgetall(keys.info_key(job_id))
    pipe.xrevrange(layout.result_key(job_id), "+", "-", count=1)
    pipe.lrange(keys.webhook_attempts_key(job_id), 0, -1)


def get_job_view(connection: Redis, job_id: str, owner: str | None = None) -> dict[str, Any]:
    """Everything a client may see of a job, read in one round trip; NotFound if unknown or expired."""
    with connection.pipeline(transaction=False) as pipe:
        _queue_view_reads(pipe, job_id)
        replies = pipe.execute()
    return _view_of(job_id, owner, replies)


async def get_job_view_async(connection: AsyncRedis, job_id: str, owner: str | None = None) -> dict[str, Any]:
    """``get_job_view`` on the API's ``redis.asyncio`` client: the same reads and the same view."""
    async with connection.pipeline(transaction=False) as pipe:
        _queue_view_reads(pipe, job_id)
        replies = await pipe.execute()
    return _view_of(job_id, owner, replies)


def _view_of(job_id: str, owner: str | None, replies: list[Any]) -> dict[str, Any]:
    """The view from the replies of ``_queue_view_reads``; no I/O."""
    raw_job, pttl_ms, raw_info, results, attempts = replies
    info = JobInfo.of(_decode_hash(raw_info))
    if owner is not None and info.owner != owner:
        raise NotFound(f"no job {job_id!r}")  # another key's job: as if it did not exist
    # A hash without its enqueue fields is a leftover, not a job (an older worker could write one after expiry).
    if not raw_job or b"status" not in raw_job or b"origin" not in raw_job:
        if _expired_unrun(info):
            return _with_webhook(_expired_view(job_id, info), info, attempts)
        raise NotFound(f"no job {job_id!r} (unknown, or its result expired)")
    try:
        job = rqhash.JobFields(raw_job)
    except (KeyError, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise NotFound(f"job {job_id!r} cannot be read ({type(exc).__name__}); it may have expired") from None
    status = public_status(job.status)
    model, version = keys.split_served(info.model or keys.model_from_queue(job.origin))
    expires_at = _expires_at(status, job, pttl_ms)
    view: dict[str, Any] = {
        "id": job_id,
        "model": model,
        "version": version,
        "created_at": isoformat(job.created_at),
        **_fields(status, job.enqueued_at, job.started_at, job.ended_at, info, job.worker_name, expires_at),
    }
    if status == "canceled":
        view["error"] = info.error or "canceled by request"
    elif results and status in ("finished", "failed"):
        _, payload = results[0]
        try:
            succeeded, value = rqhash.result_of(payload)
        except (ValueError, TypeError, KeyError, zlib.error):
            # Not written by inferq (a pickle, say): never loaded, reported as unreadable.
            view["error"] = "the stored result is not readable JSON"
        else:
            if succeeded:
                view["result"] = value
            else:
                view["error"] = info.error or _failure_reason(value)
    return _with_webhook(view, info, attempts)


def _fields(
    status: str,
    enqueued_at: datetime | None,
    started_at: datetime | None,
    ended_at: datetime | None,
    info: JobInfo,
    worker: str | None,
    expires_at: str | None,
) -> dict[str, Any]:
    """A view's fields but for its id, model, version and created_at, its result and error still None: the one
    builder of a job read back (``_view_of``), one that expired unrun, and the view a worker publishes as a waited job
    ends (``ended_view``), so the two a waiting request may be answered with cannot differ."""
    return {
        "status": status,
        "enqueued_at": isoformat(enqueued_at),
        "started_at": isoformat(started_at) if status != "queued" else None,
        "ended_at": isoformat(ended_at) if status in TERMINAL else None,
        "batch_size": info.batch_size,
        "worker": worker or None,
        "weights_sha256": info.weights,
        "timings_ms": info.timings_ms,
        "result": None,
        "error": None,
        "expires_at": expires_at,
    }


def kept_until(ended_at: datetime, ttl_s: int) -> str | None:
    """A job's ``expires_at`` once it ended with a result: its end plus the TTL its finish gave it."""
    return isoformat(ended_at + timedelta(seconds=ttl_s))


def _expires_at(status: str, job: rqhash.JobFields, pttl_ms: int) -> str | None:
    """When a job read back goes. One that ended with a result: ``kept_until`` with the TTL its hash names for that
    end, the same instant on every read and in the view its worker published (now plus the key's PTTL moved by a
    millisecond from read to read); any other: now plus what is left of its hash's TTL."""
    ttl_s = job.result_ttl if status == "finished" else job.failure_ttl if status == "failed" else None
    if ttl_s is not None and job.ended_at is not None:
        return kept_until(job.ended_at, ttl_s)
    return isoformat(utcnow() + timedelta(milliseconds=pttl_ms)) if pttl_ms > 0 else None


def ended_view(
    status: str,
    enqueued_at: datetime | None,
    started_at: datetime,
    ended_at: datetime,
    info: JobInfo,
    ttl_s: int,
    result_json: str | None,
) -> bytes:
    """A job's view as it ends, but for its id, model and created_at, which a waiting request knows already.

    The worker publishes it with the end event of a job whose submit waits (``Prefer: wait``): the API
    answers that request from the event, with no read of its own (that read was a sixth of a waited
    request's cost). The same fields ``_view_of`` reads back once the finish stored them, built by the same
    ``_fields`` and encoded as the API encodes a view (``shared.view``), so a request answered from it gets the bytes
    a read would have given.
    """
    fields = _fields(status, enqueued_at, started_at, ended_at, info, info.worker, kept_until(ended_at, ttl_s))
    if status == "finished" and result_json is not None:
        fields["result"] = orjson.loads(result_json)
    elif status == "failed":
        fields["error"] = info.error
    return encode_fields(fields)


def view_from_event(
    event: dict[str, Any], job_id: str, model: str, version: int, created_at: str | None
) -> dict[str, Any] | None:
    """The job's view from its end event, when the worker published one with it (``ended_view``)."""
    carried = event.get("view")
    if not isinstance(carried, dict) or event.get("id") != job_id:
        return None
    known = {"id": job_id, "model": model, "version": version, "status": carried["status"], "created_at": created_at}
    return known | carried


def _with_webhook(view: dict[str, Any], info: JobInfo, attempts: list[bytes]) -> dict[str, Any]:
    if info.webhook is not None:
        view["webhook"] = {"url": info.webhook, "attempts": [json.loads(a) for a in attempts]}
    return view


def _expired_unrun(info: JobInfo) -> bool:
    """RQ dropped the job hash because its queue deadline passed before any worker took it."""
    deadline = info.deadline if info.deadline is not None else float("inf")
    return deadline <= time.time() and not info.ran and not info.canceled


def _expired_view(job_id: str, info: JobInfo) -> dict[str, Any]:
    assert info.deadline is not None  # _expired_unrun
    ended = datetime.fromtimestamp(info.deadline, UTC)
    model, version = keys.split_served(info.model or "")
    return {
        "id": job_id,
        "model": model,
        "version": version,
        "created_at": None,
        **_fields("expired", None, None, ended, JobInfo(), None, None),
        "error": "expired: still queued when its deadline passed; it never ran",
    }


def _failure_reason(exc_string: str | None) -> str | None:
    if exc_string and "AbandonedJobError" in exc_string:
        # RQ's cleanup wrote this: the worker's heartbeat stopped with the job still running.
        return "the worker running this job died (killed or crashed) and no retries were left"
    return _last_line(exc_string)


def _last_line(text: str | None) -> str | None:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


def cancel_job(queues: QueueCache, settings: Settings, job_id: str, owner: str | None = None) -> None:
    """Cancel a queued or started job; Conflict if it already ended, NotFound if unknown."""
    submit.cancel(queues.connection, settings, job_id, owner)


async def cancel_job_async(connection: AsyncRedis, settings: Settings, job_id: str, owner: str | None = None) -> None:
    """``cancel_job`` on the API's ``redis.asyncio`` client."""
    await submit.cancel_async(connection, settings, job_id, owner)
