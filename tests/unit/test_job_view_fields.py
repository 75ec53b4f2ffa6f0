"""A job's view reads the fields of RQ's job hash and result entry itself: the same values RQ's own restore gives."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from redis import Redis
from rq.job import JobStatus
from rq.results import Result
from rq.serializers import JSONSerializer

from inferq.shared.errors import NotFound
from inferq.shared.jobs import _view_of, isoformat
from inferq.shared.lifecycle.rqhash import JobFields, result_of
from inferq.shared.rqjson import JSONJob

OFFLINE = Redis()  # RQ's objects want a connection; none of this sends a command
STAMPS = [
    datetime(2026, 11, 23, 10, 0, 0, 123456, tzinfo=UTC),
    datetime(2026, 11, 23, 10, 0, 0, 0, tzinfo=UTC),  # isoformat drops a zero fraction
    datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
]


def _encoded(value: object) -> bytes:
    """As redis-py encodes a value RQ hands it (a JobStatus is a str)."""
    if isinstance(value, bytes):
        return value
    return value.encode() if isinstance(value, str) else str(value).encode()


def _raw(job: JSONJob) -> dict[bytes, bytes]:
    return {k.encode(): _encoded(v) for k, v in job.to_dict().items()}


def _job(status: JobStatus, stamp: datetime, worker: str | None) -> JSONJob:
    job = JSONJob.create(
        "inferq.workers.tasks.infer",
        args=["m"],
        connection=OFFLINE,
        serializer=JSONSerializer,
        origin="inferq.m",
        status=status,
        result_ttl=3600,
        failure_ttl=86400,
    )
    job.created_at = job.enqueued_at = stamp
    if status != JobStatus.QUEUED:
        job.started_at = stamp
        job.worker_name = worker
    if status in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED):
        job.ended_at = stamp
    return job


@pytest.mark.parametrize("stamp", STAMPS)
@pytest.mark.parametrize(
    "status", [JobStatus.QUEUED, JobStatus.STARTED, JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED]
)
def test_the_fields_a_view_shows_are_what_rqs_restore_reads(status: JobStatus, stamp: datetime) -> None:
    raw = _raw(_job(status, stamp, "w1"))
    restored = JSONJob("x", connection=OFFLINE)
    restored.restore(raw)
    mine = JobFields(raw)
    assert mine.status == restored.get_status(refresh=False)
    assert (mine.origin, mine.worker_name) == (restored.origin, restored.worker_name)
    assert (mine.result_ttl, mine.failure_ttl) == (restored.result_ttl, restored.failure_ttl) == (3600, 86400)
    for name in ("created_at", "enqueued_at", "started_at", "ended_at"):
        assert getattr(mine, name) == getattr(restored, name), name
        assert isoformat(getattr(mine, name)) == isoformat(getattr(restored, name)), name


def test_timestamps_rq_wrote_without_a_fraction_still_read() -> None:
    raw = _raw(_job(JobStatus.FINISHED, STAMPS[0], "w1"))
    raw[b"ended_at"] = b"2026-11-23T10:00:05Z"  # RQ's older format, which its restore still accepts
    restored = JSONJob("x", connection=OFFLINE)
    restored.restore(raw)
    assert JobFields(raw).ended_at == restored.ended_at == datetime(2026, 11, 23, 10, 0, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    "field, value", [(b"ended_at", b"yesterday"), (b"status", b"exploded"), (b"created_at", b"\xff\xfe")]
)
def test_a_hash_rqs_restore_refuses_is_not_found(field: bytes, value: bytes) -> None:
    raw = _raw(_job(JobStatus.FINISHED, STAMPS[0], "w1"))
    raw[field] = value
    with pytest.raises((ValueError, UnicodeDecodeError)):
        JSONJob("x", connection=OFFLINE).restore(raw)
    with pytest.raises(NotFound, match="cannot be read"):
        _view_of("x", None, [raw, 1000, {}, [], []])
    del raw[b"data"]
    with pytest.raises(NotFound):
        _view_of("x", None, [raw, 1000, {}, [], []])


@pytest.mark.parametrize(
    "kind, value, exc",
    [
        (Result.Type.SUCCESSFUL, {"output": [0.5, 1, "x"], "nested": {"a": None}}, None),
        (Result.Type.SUCCESSFUL, None, None),
        (Result.Type.FAILED, None, "Traceback (most recent call last):\nValueError: bad input"),
        (Result.Type.FAILED, None, None),
    ],
)
def test_a_result_reads_as_rqs_result_restore_reads_it(kind: Result.Type, value: object, exc: str | None) -> None:
    result = Result("x", kind, OFFLINE, return_value=value, exc_string=exc, serializer=JSONSerializer)
    payload = {k.encode(): _encoded(v) for k, v in result.serialize().items()}
    restored = Result.restore("x", "1700000000000-0", payload, OFFLINE, serializer=JSONSerializer)
    succeeded, got = result_of(payload)
    assert succeeded == (restored.type == Result.Type.SUCCESSFUL)
    assert got == (restored.return_value if succeeded else restored.exc_string)


def test_a_result_that_is_not_inferqs_json_is_reported_not_loaded() -> None:
    raw = _raw(_job(JobStatus.FINISHED, STAMPS[0], "w1"))
    for payload in (
        {b"type": b"1", b"return_value": b"gASVBAAAAAAAAACMAXiULg=="},  # a pickle, base64-encoded
        {b"type": b"2", b"exc_string": b"bm90IHpsaWI="},  # not zlib
        {b"type": b"9"},
    ):
        view = _view_of("x", None, [raw, 1000, {}, [(b"1-0", payload)], []])
        assert view["result"] is None and view["error"] == "the stored result is not readable JSON"


def test_an_empty_status_reads_as_rqs_restore_reads_it() -> None:
    raw = _raw(_job(JobStatus.QUEUED, STAMPS[0], None))
    raw[b"status"] = b""
    restored = JSONJob("x", connection=OFFLINE)
    restored.restore(raw)
    assert JobFields(raw).status == restored.get_status(refresh=False) == JobStatus.CREATED
