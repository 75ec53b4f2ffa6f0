"""One job view: every producer of a job's view writes shared.view.JobView's fields, and the SDK carries them all.

The view used to be a dict built in four places and mirrored by hand in the API's response model and the
SDK's dataclasses; they drifted (GET /v1/jobs/{id} dropped the webhook attempts' response_bytes). Here
each producer is held to the one model and the SDK to its JSON schema, so a field added in one place and
not the others fails.
"""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import UTC, datetime
from typing import Any

import redis as redis_py
from pydantic import BaseModel

from inferq.client_types import Job, JobUrls, WebhookAttempt, WebhookInfo
from inferq.shared import view as views
from inferq.shared.jobs import (
    QueueCache,
    Submission,
    _expired_view,
    ended_view,
    enqueue_job,
    get_job_view,
    view_from_event,
)
from inferq.shared.lifecycle.info import JobInfo
from inferq.shared.settings import Settings


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_json_schema()["properties"])


def held_to_the_view(view: dict[str, Any]) -> None:
    """``view`` has every field the view always has, none it lacks, and each of the view's types."""
    assert set(views.VIEW_FIELDS) <= set(view) <= _fields(views.JobView), sorted(view)
    views.JobView.model_validate(view)
    for attempt in (view.get("webhook") or {}).get("attempts", []):
        assert set(attempt) <= _fields(views.WebhookAttempt), sorted(attempt)


def test_the_sdk_carries_every_field_of_the_view() -> None:
    sdk = {
        Job: _fields(views.JobView) | {"urls"},  # a just-submitted job's urls (JobAccepted) ride on the same Job
        WebhookAttempt: _fields(views.WebhookAttempt),
        WebhookInfo: _fields(views.WebhookView),
        JobUrls: _fields(views.JobUrls),
    }
    for cls, expected in sdk.items():
        assert {f.name for f in dataclasses.fields(cls)} == expected, cls.__name__
    assert _fields(views.JobAccepted) <= _fields(views.JobView) | {"urls"}


def test_a_full_view_round_trips_through_the_sdk() -> None:
    attempt = {
        "attempt": 1,
        "at": "2026-01-02T03:04:05Z",
        "status_code": 204,
        "response_bytes": 17,
        "error": None,
        "outcome": "delivered",
        "next_attempt_in_s": None,
    }
    full = views.JobView(
        id="j",
        model="m",
        version=2,
        status="finished",
        created_at="2026-01-02T03:04:05Z",
        enqueued_at="2026-01-02T03:04:05Z",
        started_at="2026-01-02T03:04:05.500000Z",
        ended_at="2026-01-02T03:04:06Z",
        batch_size=3,
        worker="w",
        weights_sha256="ab" * 32,
        timings_ms={"queue_ms": 1.5, "inference_ms": 2.0},
        result={"label": "x"},
        error=None,
        expires_at="2026-01-02T04:04:06Z",
        webhook=views.WebhookView(url="https://h/", attempts=[views.WebhookAttempt(**attempt)]),
    ).model_dump(mode="json")
    assert set(full["webhook"]["attempts"][0]) == set(attempt)
    data = Job.from_dict(full).to_dict()
    assert data.pop("urls") is None
    assert data == full


def test_a_queued_job_read_back_is_the_view(redis: redis_py.Redis) -> None:
    settings = Settings(redis_url="redis://unused")
    job = enqueue_job(QueueCache(redis), settings, Submission("m", b"x", "image/png", webhook="http://h/"))
    held_to_the_view(get_job_view(redis, job.id))


def test_an_expired_job_is_the_view() -> None:
    info = {"model": "m@3", "deadline": f"{time.time() - 1:.3f}", "webhook": "http://h/"}
    view = _expired_view("j", JobInfo.of(info))
    held_to_the_view(view)
    assert (view["model"], view["version"]) == ("m", 3)


def test_the_view_a_worker_publishes_as_a_waited_job_ends_is_the_view() -> None:
    now = datetime.now(UTC)
    info = {"batch_size": "2", "worker": "w", "queue_ms": "1.0", "inference_ms": "2.0", "weights_sha256": "ab" * 32}
    for status, result in (("finished", '{"label":"x"}'), ("failed", None)):
        published = ended_view(status, now, now, now, JobInfo.of(info | {"error": "boom"}), 60, result)
        event = {"id": "j", "model": "m", "status": status, "view": json.loads(published)}
        carried = view_from_event(event, "j", "m", 2, "2026-01-02T03:04:05Z")
        assert carried is not None
        held_to_the_view(carried)
        assert (carried["version"], carried["weights_sha256"]) == (2, "ab" * 32)
