"""Writing a bulk batch in bounded steps: no Redis call does more than one slice of it, and the writer holds at
most one slice of its items, so the API's memory does not grow with the upload.

1. **Stage** (a round trip a slice, as the API reads the upload): each chunk's input (a plain SET), its info
   and RQ job hashes, the chunk ids and the refused lines' result lines (``STAGE_CHUNKS``). Nothing is queued
   and no record names them: an upload that dies here (client gone, API killed) leaves keys that expire in
   ``STAGE_TTL_S``.
2. **Queue** (``QUEUE_BATCH``, one bounded step): the Idempotency-Key and the lane's bound are checked and the
   record written, ``pending``: hidden from every route (its reads, cancel and results answer 404).
3. **Push** (``PUSH_CHUNKS``, a slice at a time): the chunks enter the queue with a queued job's TTLs, and
   workers may run them at once. An API that dies here leaves the chunks it queued to run and end as usual
   (into the hidden record, which expires); the rest expire staged. Nothing is queued that cannot end, and a
   retry under the same Idempotency-Key makes a new batch once the pending claim (``PENDING_IDEMPOTENCY_TTL_S``)
   lapses.
4. **Publish** (``PUBLISH_BATCH``): the record is visible, the Idempotency-Key names it for its whole TTL, and a
   batch whose items all ended meanwhile ends there.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis import Redis
from redis.exceptions import RedisError
from rq.utils import now, utcformat

from inferq.shared import durability, keys, metrics, tenants
from inferq.shared.errors import PayloadTooLarge
from inferq.shared.lifecycle import bulk_scripts, calls, layout, submit
from inferq.shared.lifecycle.info import at_upload
from inferq.shared.lifecycle.lua import told
from inferq.shared.settings import Settings

log = logging.getLogger(__name__)
CHUNK_CONTENT_TYPE = "application/vnd.inferq.chunk+json"

# One staging call takes at most this many items, chunks or bytes of input (a chunk is never split, so one
# chunk larger than SLICE_BYTES goes alone); the API reads an upload in slices of as many lines. Sized so a call
# holds Redis for a few milliseconds at most (bench/bulk_bounds.py measures it).
SLICE_ITEMS = 500
SLICE_CHUNKS = 25
SLICE_BYTES = 256 * 1024
# One push call queues at most this many chunks.
PUSH_SLICE_CHUNKS = 250
# How long staged keys live: an upload that takes longer is refused ("stale") rather than queued half-expired.
STAGE_TTL_S = 3600
# How long an Idempotency-Key names a batch that is still being queued: a retry meanwhile answers 409, and one
# after an API that died mid-queue makes a new batch once this passed.
PENDING_IDEMPOTENCY_TTL_S = 300


@dataclass(frozen=True)
class BulkItem:
    custom_id: str
    payload: bytes
    content_type: str
    # The line's W3C trace context (``traceparent``, maybe ``tracestate``), when it gave one: its spans continue it.
    trace: dict[str, str] | None = None


class BatchWriter:
    """One upload, written as it is read: ``check_ids``, ``add`` and ``fail`` per slice, then ``commit``."""

    def __init__(
        self,
        connection: Redis,
        settings: Settings,
        batch_id: str,
        model: str,
        lane: str,
        chunk_size: int,
        result_ttl_s: int,
        owner: str | None = None,
        webhook: str | None = None,
        max_queue_length: int | None = None,
        tenant: str = tenants.DEFAULT,
        fair: bool = False,
        weight: float = 1.0,
        bulk_lines: int | None = None,
    ) -> None:
        self.connection, self.settings = connection, settings
        # Whose upload it is; with several tenants its chunks are queued in weighted fair order (lib/fair.lua).
        self.tenant, self.fair, self.weight = tenant, fair, weight
        self.bulk_lines = bulk_lines  # the tenant's quota of upload lines waiting (None: none)
        self.id, self.model, self.lane = batch_id, model, lane
        self.chunk_size, self.result_ttl_s = chunk_size, result_ttl_s
        self.owner, self.webhook = owner, webhook
        self.queue_name = keys.queue_name(model, lane)
        # The lane's bound (docs/bulk.md): the interactive lane counts chunks as single jobs, the bulk
        # lane counts waiting items.
        self.max_chunks = (max_queue_length or settings.max_queue_length) if lane == keys.INTERACTIVE else None
        self.max_items = settings.max_bulk_queued_items if lane == keys.BULK else None
        self.created = now()
        window_s = settings.batch_window_s
        self.live_s = window_s + settings.job_timeout_s + 60
        self.record_ttl_s = self.live_s + result_ttl_s
        self.info_ttl_s = self.live_s + max(result_ttl_s, settings.failure_ttl_s)
        template = submit.job_template(
            self.queue_name,
            model,
            window_s,
            result_ttl_s,
            settings.failure_ttl_s,
            settings.job_timeout_s,
            settings.job_retries,
            "bulk chunk",
        )
        stamp = utcformat(self.created)
        self._job = {**template, "created_at": stamp, "enqueued_at": stamp}
        self._deadline = f"{self.created.timestamp() + window_s:.3f}"
        self._chunk: list[BulkItem] = []  # the next chunk, not yet full
        self._ready: list[list[BulkItem]] = []  # full chunks, not yet staged
        self._ready_items = self._ready_bytes = 0
        self._refused: list[str] = []  # result lines of refused lines, not yet staged
        self.items = 0  # items taken
        self.failed = 0  # refused lines that have a result line
        self.chunks = 0  # chunks staged
        self.queued = False  # the record is written: its chunks are its own now, never discarded

    def check_ids(self, pairs: Sequence[tuple[str, int]]) -> list[int]:
        """For each (custom_id, line number): 0 if the upload had not held it yet, else the line that first did."""
        if not pairs:
            return []
        args = {"ttl": STAGE_TTL_S, "ids": pairs}
        firsts = bulk_scripts.CHECK_IDS(self.connection, [keys.batch_ids_key(self.id)], args=args)
        return [int(line) for line in firsts]

    def add(self, item: BulkItem) -> None:
        """Take one item; a full slice is staged."""
        self.items += 1
        if self.max_items is not None and self.items > self.max_items:
            raise PayloadTooLarge(
                f"the upload holds more than {self.max_items} items, the most the bulk lane of model {self.model}"
                " may hold (INFERQ_MAX_BULK_QUEUED_ITEMS); split it"
            )
        if self.bulk_lines is not None and self.items > self.bulk_lines:
            # Never fits, however long it waits: not the quota's retryable 429 (docs/bulk.md).
            raise PayloadTooLarge(
                f"the upload holds more than {self.bulk_lines} items, tenant {self.tenant}'s whole bulk_lines quota"
                " (its upload lines that may wait at once): it can never be queued; split it"
            )
        self._chunk.append(item)
        if len(self._chunk) == self.chunk_size:
            self._close_chunk()

    def fail(self, line: str) -> None:
        """Take the result line of a refused input line."""
        self.failed += 1
        self._refused.append(line)
        if len(self._refused) >= SLICE_ITEMS:
            self._stage()

    def commit(
        self, idempotency: tuple[str, str] | None = None, refused_count: int = 0, refused: Sequence[Any] = ()
    ) -> tuple[str, str]:
        """Queue and publish the batch: ("ok", ""), ("dup", the key's value), ("full", ""), ("stale", "") or
        ("lines", the tenant's lines waiting: past its bulk_lines quota).

        ``refused`` (the refused lines the answer lists, of ``refused_count``) is kept for a replay of the upload.
        """
        if self._chunk:
            self._close_chunk()
        self._stage()
        chunks = -(-self.items // self.chunk_size)
        record: dict[str, Any] = {
            "id": self.id,
            "model": self.model,
            "lane": self.lane,
            "total": self.items + self.failed,
            "queued": self.items,
            "running": 0,
            "finished": 0,
            "failed": self.failed,
            "canceled": 0,
            "created_at": utcformat(self.created),
            "result_ttl": self.result_ttl_s,
            "chunks": chunks,
            "chunk_size": self.chunk_size,
            "refused_count": refused_count,
            "refused": json.dumps(list(refused), separators=(",", ":")),
            "pending": "1",
        }
        if self.owner:
            record["owner"] = self.owner
        if self.webhook:
            record["webhook"] = self.webhook
        qk = layout.queue_keys(self.queue_name)
        idem_key, idem_value = idempotency or (keys.batch_key(self.id), "")
        waiting = keys.waiting_items_key(self.queue_name)
        fixed = [qk.queue, layout.QUEUES_SET, keys.batch_key(self.id), keys.batch_chunks_key(self.id)]
        fixed += [keys.batch_results_key(self.id), keys.batch_ids_key(self.id), idem_key, waiting]
        fixed += [layout.job_key(keys.chunk_id(self.id, 0)), keys.tenant_bulk_lines_key(self.tenant), qk.fair_backlog]
        args: dict[str, Any] = {
            "has_idempotency": "1" if idempotency else "0",
            "idempotency_value": idem_value,
            "idempotency_ttl": PENDING_IDEMPOTENCY_TTL_S,
            "record_ttl": self.record_ttl_s,
            "max_chunks": "" if self.max_chunks is None else self.max_chunks,
            "max_items": "" if self.max_items is None else self.max_items,
            "chunks": chunks,
            "items": self.items,
            "batch": self.id,
            "lines_limit": self.bulk_lines or 0,
            "record": record,
        }
        verdict, existing = (_text(v) for v in bulk_scripts.QUEUE_BATCH(self.connection, fixed, args=args))
        if verdict != "ok":
            self.discard()
            return verdict, existing
        self.queued = True
        for start in range(0, chunks, PUSH_SLICE_CHUNKS):
            numbers = range(start, min(start + PUSH_SLICE_CHUNKS, chunks))
            ids = [keys.chunk_id(self.id, n) for n in numbers]
            sizes = [min(self.chunk_size, self.items - n * self.chunk_size) for n in numbers]
            per_chunk = [[layout.job_key(i), keys.payload_key(i), keys.info_key(i)] for i in ids]
            ttls = {"job_ttl": self.settings.batch_window_s, "payload_ttl": self.live_s, "info_ttl": self.info_ttl_s}
            fair = {"fair": "1" if self.fair else "0", "tenant": self.tenant, "lane": self.lane}
            fair["fair_window"] = str(layout.FAIR_WINDOW)
            fair["totals_ttl"] = str(metrics.TOTALS_TTL_S)
            costs = [repr(size / self.weight) for size in sizes]
            args = {**ttls, "waiting_ttl": self.live_s, "items": sum(sizes), **fair, "ids": ids, "costs": costs}
            fixed = [qk.queue, waiting, qk.fair_tags, qk.fair_state, keys.metrics_key(self.model), qk.fair_backlog]
            bulk_scripts.PUSH_CHUNKS(self.connection, fixed, per_chunk, args)
        hk = layout.hooks()
        fixed = [keys.batch_key(self.id), keys.batch_results_key(self.id), idem_key, layout.batch_delivery_key(self.id)]
        fixed += [hk.queue, layout.QUEUES_SET]
        args = {
            "has_idempotency": "1" if idempotency else "0",
            "idempotency_value": idem_value,
            "idempotency_ttl": self.settings.idempotency_ttl_s,
            "stamp": utcformat(now()),
            "channel": keys.EVENTS_CHANNEL,
            "delivery": calls.delivery_args(self.settings),
        }
        _, events = told(
            bulk_scripts.PUBLISH_BATCH(self.connection, fixed, args=args, defer=durability.defers(self.settings))
        )
        durability.release(self.connection, self.settings, events)
        return "ok", ""

    def discard_quietly(self) -> None:
        """``discard`` after an upload failed: Redis may be why, and what is left expires anyway."""
        try:
            self.discard()
        except RedisError as exc:
            log.warning("batch %s: its staged keys are left to expire (%s)", self.id, exc)

    def discard(self) -> None:
        """Delete what was staged (an upload refused, failed or replayed); what is left expires with its TTL."""
        if self.queued:
            return
        staged = [keys.batch_chunks_key(self.id), keys.batch_results_key(self.id), keys.batch_ids_key(self.id)]
        for start in range(0, max(self.chunks, 1), PUSH_SLICE_CHUNKS):
            names = list(staged) if start == 0 else []
            for number in range(start, min(start + PUSH_SLICE_CHUNKS, self.chunks)):
                chunk = keys.chunk_id(self.id, number)
                names += [layout.job_key(chunk), keys.payload_key(chunk), keys.info_key(chunk)]
            self.connection.unlink(*names)
        self.chunks = 0

    def _close_chunk(self) -> None:
        self._ready.append(self._chunk)
        self._ready_items += len(self._chunk)
        self._ready_bytes += sum(len(item.payload) for item in self._chunk)
        self._chunk = []
        if self._ready_items >= SLICE_ITEMS or len(self._ready) >= SLICE_CHUNKS or self._ready_bytes >= SLICE_BYTES:
            self._stage()

    def _stage(self) -> None:
        """One staging round trip: the full chunks and refused lines taken since the last."""
        if not self._ready and not self._refused:
            return
        per_chunk, staged = [], []
        with self.connection.pipeline(transaction=False) as pipe:
            for chunk in self._ready:
                chunk_id = keys.chunk_id(self.id, self.chunks)
                self.chunks += 1
                pipe.set(keys.payload_key(chunk_id), _chunk_body(chunk), ex=STAGE_TTL_S)
                per_chunk.append([layout.job_key(chunk_id), keys.info_key(chunk_id)])
                # The scripts that end a chunk unrun write its lines from its custom ids, never decoding client text.
                ids = encode_ids(item.custom_id for item in chunk)
                tenant = self.tenant if self.tenant != tenants.DEFAULT else None  # its metrics' tenant label
                info = at_upload(
                    chunk_id, self.model, self.id, len(chunk), CHUNK_CONTENT_TYPE, self._deadline, ids, tenant
                )
                job = {**self._job, "description": f"{self.model} bulk chunk of {len(chunk)} (batch {self.id})"}
                staged.append((chunk_id, info, job))
            lists = [keys.batch_chunks_key(self.id), keys.batch_results_key(self.id)]
            args = {"ttl": STAGE_TTL_S, "refused": self._refused, "chunks": staged}
            bulk_scripts.STAGE_CHUNKS(pipe, lists, per_chunk, args)
            pipe.execute()
        self._ready, self._refused = [], []
        self._ready_items = self._ready_bytes = 0


def encode_ids(custom_ids: Iterable[str]) -> str:
    """A chunk's custom ids as its info hash keeps them: JSON strings, one a line.

    ``ensure_ascii`` escapes every newline and non-ASCII character (a lone surrogate too), so a line is one id.
    """
    return "\n".join(json.dumps(custom_id, ensure_ascii=True) for custom_id in custom_ids)


# A chunk's stored body: this line, then per item a JSON header line (its custom_id, content type, trace, and the
# length of its payload) and the payload's own bytes. An image line's base64 is decoded once, at upload: the chunk
# holds the bytes themselves (storing them as base64 in JSON again was a third of an image line's API cost).
CHUNK_MAGIC = b"inferq-chunk/1\n"


def decode_chunk(payload: bytes) -> list[BulkItem]:
    """A chunk's items, as a ``BatchWriter`` stored them (or as one stored them in JSON, before the binary body)."""
    if not payload.startswith(CHUNK_MAGIC):
        items = json.loads(payload)["items"]
        return [
            BulkItem(i["custom_id"], base64.b64decode(i["payload"]), i["content_type"], i.get("trace")) for i in items
        ]
    out, at = [], len(CHUNK_MAGIC)
    view = memoryview(payload)
    while at < len(payload):
        end = payload.index(b"\n", at)
        head = json.loads(view[at:end].tobytes())
        at, size = end + 1, head["bytes"]
        out.append(BulkItem(head["custom_id"], view[at : at + size].tobytes(), head["content_type"], head.get("trace")))
        at += size
    return out


def _chunk_body(chunk: Sequence[BulkItem]) -> bytes:
    parts = [CHUNK_MAGIC]
    for i in chunk:
        head: dict[str, Any] = {"custom_id": i.custom_id, "content_type": i.content_type, "bytes": len(i.payload)}
        if i.trace:
            head["trace"] = i.trace
        parts += [json.dumps(head, separators=(",", ":")).encode(), b"\n", i.payload]
    return b"".join(parts)


def _text(value: bytes | str) -> str:
    return cast(bytes, value).decode() if isinstance(value, bytes) else str(value)
