"""RQ's storage layout, read: the fields of RQ's job hash a view shows, a result stream entry, RQ's timestamps.

The one place outside RQ that parses what RQ stores (tests/unit/test_job_view_fields.py holds each parse to RQ's
own ``Job.restore`` / ``Result.restore``); the rest of inferq reads jobs through ``shared.jobs``.
"""

from __future__ import annotations

import json
import zlib
from base64 import b64decode
from datetime import UTC, datetime
from typing import Any

from rq.job import JobStatus
from rq.results import Result
from rq.utils import str_to_date

# Every status RQ writes; a hash with another one was not written by RQ.
STATUSES = frozenset(status.value for status in JobStatus)


def parse_stamp(value: bytes | None) -> datetime | None:
    """An RQ timestamp (naive UTC, ``Z``-suffixed, with or without a fraction) as an aware datetime; None when
    absent or empty. Read without strptime, as RQ's restore reads it, which cost more than a no-op model."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.decode())
    except ValueError:
        return str_to_date(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


class JobFields:
    """The fields of an RQ job hash a view shows, parsed as RQ's ``Job.restore`` parses them.

    RQ's restore parses every field, each timestamp with ``strptime``: two thirds of a view's cost, and a
    waiting client's view is most of what its request costs the API. RQ writes its timestamps as
    ``utcformat`` does (``%Y-%m-%dT%H:%M:%S.%fZ``, or without the fraction in old jobs), which
    ``datetime.fromisoformat`` reads as the same instant.
    """

    __slots__ = (
        "status",
        "origin",
        "worker_name",
        "created_at",
        "enqueued_at",
        "started_at",
        "ended_at",
        "result_ttl",
        "failure_ttl",
    )

    def __init__(self, raw: dict[bytes, bytes]) -> None:
        raw[b"data"]  # noqa: B018 - as RQ's restore: a hash without its data is not a job
        status = (raw.get(b"status") or b"created").decode()  # as RQ: an empty status is CREATED
        if status not in STATUSES:
            raise ValueError(f"unknown job status {status!r}")
        self.status = status
        self.origin = raw[b"origin"].decode()
        self.worker_name = raw[b"worker_name"].decode() if raw.get(b"worker_name") else None
        self.created_at = parse_stamp(raw.get(b"created_at")) or datetime.now(UTC)
        self.enqueued_at = parse_stamp(raw.get(b"enqueued_at"))
        self.started_at = parse_stamp(raw.get(b"started_at"))
        self.ended_at = parse_stamp(raw.get(b"ended_at"))
        # Seconds a finished (failed) job is kept once it ends; as RQ's restore, an empty or absent one is None.
        self.result_ttl = int(raw[b"result_ttl"]) if raw.get(b"result_ttl") else None
        self.failure_ttl = int(raw[b"failure_ttl"]) if raw.get(b"failure_ttl") else None


def result_of(payload: dict[bytes, bytes]) -> tuple[bool, Any]:
    """(succeeded, its return value or else its exception text) of a result stream entry, as RQ's
    ``Result.restore`` with the JSON serializer reads them (what else it parses, a view never shows)."""
    kind = Result.Type(int(payload[b"type"]))
    if kind == Result.Type.SUCCESSFUL:
        raw = payload.get(b"return_value")
        return True, None if raw is None else json.loads(b64decode(raw))
    raw = payload.get(b"exc_string")
    return False, zlib.decompress(b64decode(raw)).decode() if raw else None
