"""Response shapes, for the OpenAPI schema at /docs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

Status = Literal["queued", "started", "finished", "failed", "canceled", "expired"]


class JobUrls(BaseModel):
    self: str
    events: str
    cancel: str


class JobAccepted(BaseModel):
    id: str
    status: Status
    model: str
    created_at: str | None
    urls: JobUrls


class WebhookAttempt(BaseModel):
    attempt: int
    at: str | None = None
    status_code: int | None = None
    error: str | None = None
    outcome: str | None = None
    next_attempt_in_s: float | None = None


class WebhookPublic(BaseModel):
    url: str
    attempts: list[WebhookAttempt]


class JobPublic(BaseModel):
    id: str
    model: str
    status: Status
    created_at: str | None
    enqueued_at: str | None = None
    started_at: str | None
    ended_at: str | None
    batch_size: int | None
    worker: str | None
    timings_ms: dict[str, float] | None = None
    result: Any = None
    error: str | None
    expires_at: str | None
    webhook: WebhookPublic | None = None


class ModelPublic(BaseModel):
    name: str
    description: str
    handler: str
    input: dict[str, Any]
    labels: list[str] | None
    max_batch: int
    queue: str
    queue_length: int


class ModelList(BaseModel):
    models: list[ModelPublic]


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (401, 404, 409, 413, 415, 422, 429, 503)
}
