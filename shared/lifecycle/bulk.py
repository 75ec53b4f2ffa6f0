"""Bulk batches: many items in, one result line per item out.

A batch's items travel in chunks of up to the model's ``max_batch``; each chunk is one RQ job in the
model's lane (so ``rq info`` counts chunks queued and running), whose input is the chunk's items.
A worker runs a chunk as one batch and appends its items' result lines in the same script that
ends the chunk, so a chunk retried after its worker died adds its lines once. The batch record
counts items by state; the scripts that end chunks (finish, cancel, maintenance failure, expiry)
move the counts and end the batch when every item has ended. An upload is written in bounded
steps (``upload``); a cancel cancels a slice of chunks per call.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from rq.utils import current_timestamp, now, utcformat

from inferq.shared import durability, keys, tenants
from inferq.shared.lifecycle import bulk_scripts, calls, layout
from inferq.shared.lifecycle.lua import CANCELED_LINE_TAIL, told
from inferq.shared.lifecycle.upload import BatchWriter
from inferq.shared.lifecycle.upload import BulkItem as BulkItem
from inferq.shared.lifecycle.upload import decode_chunk as decode_chunk
from inferq.shared.settings import Settings

# One cancel call takes at most this many chunks, and the chunks of at most this many items (one chunk if a
# chunk holds more): a few milliseconds of Redis at most (bench/bulk_bounds.py measures it).
CANCEL_SLICE_CHUNKS = 25
CANCEL_SLICE_ITEMS = 250
# A cancel call removes its canceled chunks from the queue list only while that reads at most this many
# entries (queue length x chunks); else they stay until a worker pops them, and the start drops them.
CANCEL_SCAN_ENTRIES = 50_000


@dataclass
class NewBatch:
    """A whole batch in memory, for ``enqueue_batch`` (the API streams its uploads through a ``BatchWriter``)."""

    id: str
    model: str
    lane: str
    chunk_size: int
    result_ttl_s: int
    items: list[BulkItem] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # result lines of input lines refused at upload
    owner: str | None = None
    webhook: str | None = None
    idempotency: tuple[str, str] | None = None  # (key, "<batch id> <fingerprint>")
    # Whose batch it is, and whether (with what weight) its chunks are queued in fair order among the tenants'.
    tenant: str = tenants.DEFAULT
    fair: bool = False
    weight: float = 1.0
    bulk_lines: int | None = None  # the tenant's quota of upload lines waiting

    @property
    def total(self) -> int:
        return len(self.items) + len(self.refused)


def enqueue_batch(
    connection: Redis, settings: Settings, new: NewBatch, max_queue_length: int | None = None
) -> tuple[str, str]:
    """Write and queue the batch: ("ok", ""), ("dup", the Idempotency-Key's value), ("full", "") or ("stale", "")."""
    writer = BatchWriter(
        connection,
        settings,
        new.id,
        new.model,
        new.lane,
        new.chunk_size,
        new.result_ttl_s,
        owner=new.owner,
        webhook=new.webhook,
        max_queue_length=max_queue_length,
        tenant=new.tenant,
        fair=new.fair,
        weight=new.weight,
        bulk_lines=new.bulk_lines,
    )
    for line in new.refused:
        writer.fail(line)
    for item in new.items:
        writer.add(item)
    return writer.commit(new.idempotency)


def read_batch(connection: Redis, batch_id: str, owner: str | None = None) -> dict[str, Any] | None:
    """The batch as a client sees it; None if unknown, expired, or another key's."""
    if not keys.JOB_ID_RE.match(batch_id):
        return None
    return batch_view(batch_id, cast(dict[bytes, bytes], connection.hgetall(keys.batch_key(batch_id))), owner)


async def recount_bulk_lines_async(connection: AsyncRedis, tenant: str) -> int:
    """A tenant's upload lines still waiting, as its batches' records say now: each batch's count in the tenant's
    bulk_lines hash (lua/queue-batch.lua) is brought down to its record's, and an ended or expired batch dropped."""
    key = keys.tenant_bulk_lines_key(tenant)
    batches = [b.decode() for b in await cast(Awaitable[list[bytes]], connection.hkeys(key))]
    if not batches:
        return 0
    async with connection.pipeline(transaction=False) as pipe:
        for batch in batches:
            pipe.hmget(keys.batch_key(batch), ["queued", "ended_at"])
        records = cast(list[list[bytes | None]], await pipe.execute())
    waiting = {b: int(queued or 0) for b, (queued, ended) in zip(batches, records, strict=True) if not ended}
    gone = [b for b in batches if not waiting.get(b)]
    async with connection.pipeline(transaction=False) as pipe:
        if gone:
            pipe.hdel(key, *gone)
        for batch, count in waiting.items():
            if count:
                pipe.hset(key, batch, str(count))  # never raises a count: the script's may be newer
        await pipe.execute()
    return sum(waiting.values())


async def read_batch_async(connection: AsyncRedis, batch_id: str, owner: str | None = None) -> dict[str, Any] | None:
    """``read_batch`` on the API's ``redis.asyncio`` client."""
    if not keys.JOB_ID_RE.match(batch_id):
        return None
    raw = await cast(Awaitable[dict[bytes, bytes]], connection.hgetall(keys.batch_key(batch_id)))
    return batch_view(batch_id, raw, owner)


def batch_view(batch_id: str, raw: dict[bytes, bytes], owner: str | None) -> dict[str, Any] | None:
    """The client's view of a batch record as read (None if it is empty, still pending, or another key's)."""
    record = {k.decode(): v.decode() for k, v in raw.items()}
    if not record or "pending" in record or (owner is not None and record.get("owner") != owner):
        return None  # a pending batch is still being queued: its upload has not been answered
    counts = {name: int(record.get(name, 0)) for name in ("total", "queued", "running", "finished", "failed")}
    counts["canceled"] = int(record.get("canceled", 0))
    ended = "ended_at" in record
    # Whether a cancel was asked says nothing: one that came while every chunk left was running canceled none.
    if ended and counts["canceled"] > 0:
        status = "canceled"
    elif ended:
        status = "finished"
    elif counts["running"] or "started_at" in record:
        status = "running"
    else:
        status = "queued"
    done = counts["finished"] + counts["failed"] + counts["canceled"]
    started = _time(record.get("started_at"))
    rate = eta = None
    if started is not None:
        end = _time(record.get("ended_at")) or datetime.now(UTC)
        elapsed = (end - started).total_seconds()
        if elapsed > 0 and counts["finished"] + counts["failed"]:
            rate = (counts["finished"] + counts["failed"]) / elapsed
            eta = 0.0 if ended else (counts["total"] - done) / rate
    model, version = keys.split_served(record.get("model", ""))
    return {
        "id": batch_id,
        "model": model,
        "version": version,
        "status": status,
        "priority": record.get("lane", keys.BULK),
        "counts": counts,
        "created_at": _iso(record.get("created_at")),
        "started_at": _iso(record.get("started_at")),
        "ended_at": _iso(record.get("ended_at")),
        "items_per_s": round(rate, 3) if rate is not None else None,
        "eta_s": round(eta, 1) if eta is not None else None,
        "webhook": record.get("webhook"),
    }


def result_lines(connection: Redis, batch_id: str, start: int, count: int) -> list[bytes]:
    """Up to ``count`` result lines from position ``start``, in the order items ended."""
    return cast(list[bytes], connection.lrange(keys.batch_results_key(batch_id), start, start + count - 1))


async def result_lines_async(connection: AsyncRedis, batch_id: str, start: int, count: int) -> list[bytes]:
    """``result_lines`` on the API's ``redis.asyncio`` client."""
    reply = connection.lrange(keys.batch_results_key(batch_id), start, start + count - 1)
    return await cast(Awaitable[list[bytes]], reply)


def cancel_batch(connection: Redis, settings: Settings, batch_id: str, owner: str | None = None) -> str:
    """Cancel every chunk still queued, a slice of chunks per call: "ok", "missing" or "ended"."""
    if not keys.JOB_ID_RE.match(batch_id):
        return "missing"
    fields = ["lane", "model", "chunk_size", "chunks", "pending"]
    record = cast(list[bytes | None], connection.hmget(keys.batch_key(batch_id), fields))
    lane, model, chunk_size, chunks, pending = record
    if lane is None or model is None or pending is not None:
        return "missing"
    qk = layout.queue_keys(keys.queue_name(model.decode(), lane.decode()))
    fixed = [keys.batch_key(batch_id), keys.batch_results_key(batch_id), qk.queue, qk.canceled]
    fixed += [layout.batch_delivery_key(batch_id), layout.hooks().queue, layout.QUEUES_SET]
    fixed += [*calls.metrics_keys(model.decode())[:2], keys.waiting_items_key(qk.name), qk.fair_tags, qk.fair_backlog]
    per_call = max(1, min(CANCEL_SLICE_CHUNKS, CANCEL_SLICE_ITEMS // int(chunk_size or 1)))
    events: list[bytes] = []
    try:
        return _cancel_slices(connection, settings, batch_id, owner, fixed, chunks, per_call, events)
    finally:
        durability.release(connection, settings, events)  # the batch's end (if this ended it) once a replica has it


def _cancel_slices(
    connection: Redis,
    settings: Settings,
    batch_id: str,
    owner: str | None,
    fixed: list[str],
    chunks: Any,
    per_call: int,
    events: list[bytes],
) -> str:
    for start in range(0, max(int(chunks or 0), 1), per_call):
        # The chunk list is complete and never changes once the batch is visible.
        span = cast(list[bytes], connection.lrange(keys.batch_chunks_key(batch_id), start, start + per_call - 1))
        per_chunk = [
            [layout.job_key(i), keys.info_key(i), keys.payload_key(i), keys.attempt_key(i)] for i in map(_text, span)
        ]
        args = {
            "owner": owner or "",
            "ttl": settings.canceled_ttl_s,
            "now": current_timestamp(),
            "stamp": utcformat(now()),
            "channel": keys.EVENTS_CHANNEL,
            "canceled_tail": CANCELED_LINE_TAIL,
            "scan_bound": CANCEL_SCAN_ENTRIES,
            "metrics": calls.metrics_args(),
            "delivery": calls.delivery_args(settings),
        }
        reply, told_events = told(
            bulk_scripts.CANCEL_CHUNKS(connection, fixed, per_chunk, args, defer=durability.defers(settings))
        )
        events += told_events
        verdict = _text(reply[0])
        if verdict != "ok":
            # Ended by an earlier slice of this cancel (its last items canceled), or by workers meanwhile.
            return verdict if start == 0 else "ok"
    return "ok"


async def read_refused_async(connection: AsyncRedis, batch_id: str) -> tuple[int, list[Any]]:
    """How many lines the batch's upload refused, and those its answer listed: a replay answers the same."""
    reply = connection.hmget(keys.batch_key(batch_id), ["refused_count", "refused"])
    count, shown = await cast(Awaitable[list[bytes | None]], reply)
    return int(count or 0), json.loads(shown) if shown else []


async def is_pending_async(connection: AsyncRedis, batch_id: str) -> bool:
    """Whether the batch exists but is still being queued (its upload not yet answered)."""
    return bool(await cast(Awaitable[int], connection.hexists(keys.batch_key(batch_id), "pending")))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.rstrip("Z")).replace(tzinfo=UTC)


def _iso(value: str | None) -> str | None:
    parsed = _time(value)
    return parsed.isoformat().replace("+00:00", "Z") if parsed else None
