"""The one job view a client sees: the GET route, a waited submit, the end event, the webhook body and the SDK.

Every producer of a job's view (``shared.jobs``: a job read back, an expired one, the view a worker
publishes as a waited job ends) writes these fields and no others; tests/integration/test_job_view_contract.py holds
each of them, and the SDK's ``inferq.Job``, to this model's JSON schema, so they cannot drift apart.
The API answers with these models, so /openapi.json documents what is really sent, and every way a view is sent
encodes it with ``encode_view`` (tests/e2e/test_e2e_job_views.py compares their bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_json

Status = Literal["queued", "started", "finished", "failed", "canceled", "expired"]


class JobUrls(BaseModel):
    """Where to read, stream and cancel a job."""

    self: str
    events: str
    cancel: str


class JobAccepted(BaseModel):
    """The 202 answer to a submit: the job's id and where to find it."""

    id: str
    status: Status
    model: str
    version: int
    created_at: str | None
    enqueued_at: str | None
    urls: JobUrls


class WebhookAttempt(BaseModel):
    """One delivery attempt of a job's webhook, as the sender records it (workers/webhooks.py)."""

    attempt: int
    at: str | None = None
    status_code: int | None = None
    # Bytes of the receiver's answer the sender read (it stops reading at webhooks.RESPONSE_BYTES_MAX).
    response_bytes: int | None = None
    error: str | None = None
    outcome: str | None = None
    next_attempt_in_s: float | None = None


class WebhookView(BaseModel):
    """A job's webhook and its delivery attempts so far."""

    url: str
    attempts: list[WebhookAttempt]


class JobView(BaseModel):
    """Everything a client may see of a job."""

    id: str
    model: str
    # The model's version the job was routed to at submit (and runs on, retries too); 1 for a model without versions.
    version: int
    status: Status
    created_at: str | None
    enqueued_at: str | None = None
    started_at: str | None
    ended_at: str | None
    batch_size: int | None
    worker: str | None
    # The SHA-256 of the weights that answered (GET /v1/models names each version's): None until it ran.
    weights_sha256: str | None = None
    timings_ms: dict[str, float] | None = None
    result: Any = None
    error: str | None
    expires_at: str | None
    webhook: WebhookView | None = None


# The fields of a view every producer writes (``webhook`` only for a job that has one).
VIEW_FIELDS = tuple(name for name in JobView.model_fields if name != "webhook")


_JOB_VIEW = TypeAdapter(JobView)


def encode_view(view: Mapping[str, Any]) -> bytes:
    """A job's view as JSON, as every route, stream and webhook sends it: JobView's fields in its order (``webhook``
    null for a job without one), encoded by pydantic as FastAPI encodes a route's response model. The GET route's
    answer was that, while a waited submit's and the SSE events' were json.dumps of the dict (no ``webhook``,
    ``1.5e-05`` for pydantic's ``0.000015``)."""
    return _JOB_VIEW.dump_json(_JOB_VIEW.validate_python(view))


def encode_fields(fields: Mapping[str, Any]) -> bytes:
    """Some of a view's fields (the view a worker publishes with a waited job's end) with ``encode_view``'s encoder:
    each value's JSON is the same text as in the whole view."""
    return to_json(fields)
