"""Bulk batches: many items in, one result line per item out.

A batch's items travel in chunks of up to the model's ``max_batch``; each chunk is one RQ job in the
model's lane (so ``rq info`` counts chunks queued and running), whose input is the chunk's items.
A worker runs a chunk as one batch and appends its items' result lines in the same script that
ends the chunk, so a chunk retried after its worker died adds its lines once. The batch record
counts items by state; the scripts that end chunks (finish, cancel, maintenance failure, expiry)
move the counts and end the batch when every item has ended.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from redis import Redis
from rq.job import Retry
from rq.utils import current_timestamp, now, utcformat

from shared import keys
from shared.lifecycle import layout, scripts, store
from shared.settings import Settings

CHUNK_CONTENT_TYPE = "application/vnd.inferq.chunk+json"


@dataclass(frozen=True)
class BulkItem:
    custom_id: str
    payload: bytes
    content_type: str


@dataclass
class NewBatch:
    """What ``enqueue_batch`` writes; the API builds it from an upload."""

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

    @property
    def total(self) -> int:
        return len(self.items) + len(self.refused)


def _flat(mapping: dict[str, Any]) -> list[Any]:
    return [len(mapping), *(value for pair in mapping.items() for value in pair)]


def _chunks(items: Sequence[BulkItem], size: int) -> Iterator[Sequence[BulkItem]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def enqueue_batch(connection: Redis, settings: Settings, new: NewBatch) -> tuple[str, str]:
    """Write the batch and queue its chunks in one atomic step: ("ok", "") or ("dup", stored value)."""
    window_s = settings.batch_window_s
    live_s = window_s + settings.job_timeout_s + 60
    record_ttl_s = live_s + new.result_ttl_s
    queue = layout.offline_queue(keys.queue_name(new.model, new.lane))
    qk = layout.queue_keys(queue.name)
    created = now()
    record: dict[str, Any] = {
        "id": new.id,
        "model": new.model,
        "lane": new.lane,
        "total": new.total,
        "queued": len(new.items),
        "running": 0,
        "finished": 0,
        "failed": len(new.refused),
        "canceled": 0,
        "created_at": utcformat(created),
        "result_ttl": new.result_ttl_s,
        "chunks": -(-len(new.items) // new.chunk_size),
    }
    if new.owner:
        record["owner"] = new.owner
    if new.webhook:
        record["webhook"] = new.webhook
    idem_key, idem_value = new.idempotency or (keys.batch_key(new.id), "")
    args: list[Any] = ["1" if new.idempotency else "0", idem_value, settings.idempotency_ttl_s, record_ttl_s]
    args += [*_flat(record), len(new.refused), *new.refused]
    per_chunk = []
    for number, chunk in enumerate(_chunks(new.items, new.chunk_size)):
        chunk_id = keys.chunk_id(new.id, number)
        job = queue.create_job(
            layout.INFER_FUNC,
            kwargs={"model": new.model},
            job_id=chunk_id,
            ttl=window_s,
            result_ttl=new.result_ttl_s,
            failure_ttl=settings.failure_ttl_s,
            timeout=settings.job_timeout_s,
            description=f"{new.model} bulk chunk of {len(chunk)} (batch {new.id})",
            retry=Retry(max=settings.job_retries) if settings.job_retries else None,
        )
        job.origin, job.enqueued_at = queue.name, created
        fields = job.to_dict()
        fields["status"] = "queued"
        info = {
            "id": chunk_id,
            "model": new.model,
            "batch": new.id,
            "items": len(chunk),
            "content_type": CHUNK_CONTENT_TYPE,
            "result_ttl_s": new.result_ttl_s,
            "deadline": f"{created.timestamp() + window_s:.3f}",
            # The scripts that end a chunk unrun write its lines from these, never decoding client text.
            "custom_ids": encode_ids(item.custom_id for item in chunk),
        }
        body = json.dumps(
            {
                "items": [
                    {
                        "custom_id": item.custom_id,
                        "content_type": item.content_type,
                        "payload": base64.b64encode(item.payload).decode(),
                    }
                    for item in chunk
                ]
            },
            separators=(",", ":"),
        )
        per_chunk.append([layout.job_key(chunk_id), keys.payload_key(chunk_id), keys.info_key(chunk_id)])
        info_ttl_s = live_s + max(new.result_ttl_s, settings.failure_ttl_s)
        args += [chunk_id, body, live_s, info_ttl_s, window_s, *_flat(info), *_flat(fields)]
    fixed = [qk.queue, layout.QUEUES_SET, keys.batch_key(new.id), keys.batch_chunks_key(new.id)]
    fixed += [keys.batch_results_key(new.id), idem_key]
    verdict, existing = scripts.ENQUEUE_BATCH(connection, fixed, per_chunk, args)
    return _text(verdict), _text(existing)


def read_batch(connection: Redis, batch_id: str, owner: str | None = None) -> dict[str, Any] | None:
    """The batch as a client sees it; None if unknown, expired, or another key's."""
    if not keys.JOB_ID_RE.match(batch_id):
        return None
    raw = cast(dict[bytes, bytes], connection.hgetall(keys.batch_key(batch_id)))
    record = {k.decode(): v.decode() for k, v in raw.items()}
    if not record or (owner is not None and record.get("owner") != owner):
        return None
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
    return {
        "id": batch_id,
        "model": record.get("model", ""),
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


def cancel_batch(connection: Redis, settings: Settings, batch_id: str, owner: str | None = None) -> str:
    """Cancel every chunk still queued: "ok", "missing" or "ended"."""
    if not keys.JOB_ID_RE.match(batch_id):
        return "missing"
    lane = cast(bytes | None, connection.hget(keys.batch_key(batch_id), "lane"))
    model = cast(bytes | None, connection.hget(keys.batch_key(batch_id), "model"))
    if lane is None or model is None:
        return "missing"
    qk = layout.queue_keys(keys.queue_name(model.decode(), lane.decode()))
    chunk_ids = [_text(i) for i in cast(list[bytes], connection.lrange(keys.batch_chunks_key(batch_id), 0, -1))]
    per_chunk = [[layout.job_key(i), keys.info_key(i), keys.payload_key(i)] for i in chunk_ids]
    fixed = [keys.batch_key(batch_id), keys.batch_results_key(batch_id), qk.queue, qk.canceled]
    fixed += [layout.delivery_key(batch_id), layout.hooks().queue, layout.QUEUES_SET]
    fixed += store.metrics_keys(model.decode())[:2]
    args = [owner or "", settings.canceled_ttl_s, current_timestamp(), utcformat(now()), keys.EVENTS_CHANNEL]
    args += [store.CANCELED_LINE_TAIL, *store.metrics_args()]
    args += layout.delivery_template(settings.webhook_ttl_s, settings.webhook_timeout_s)
    return _text(scripts.CANCEL_BATCH(connection, fixed, per_chunk, args)[0])


def encode_ids(custom_ids: Iterable[str]) -> str:
    """A chunk's custom ids as its info hash keeps them: JSON strings, one a line.

    ``ensure_ascii`` escapes every newline and non-ASCII character (a lone surrogate too), so a line is one id.
    """
    return "\n".join(json.dumps(custom_id, ensure_ascii=True) for custom_id in custom_ids)


def decode_chunk(payload: bytes) -> list[BulkItem]:
    """A chunk's items, as ``enqueue_batch`` stored them."""
    items = json.loads(payload)["items"]
    return [BulkItem(i["custom_id"], base64.b64decode(i["payload"]), i["content_type"]) for i in items]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.rstrip("Z")).replace(tzinfo=UTC)


def _iso(value: str | None) -> str | None:
    parsed = _time(value)
    return parsed.isoformat().replace("+00:00", "Z") if parsed else None
