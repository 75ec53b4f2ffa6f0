"""What inferq's SDK returns and raises: results mirroring the API's schemas, one error tree, the retry policy.

Import them from ``inferq.client``, which re-exports every name here.

    InferqError
     ├── TransportError          the API could not be reached, after retries
     ├── APIError                the API answered an error: .status, .code, .message, .retry_after_s
     │    ├── InvalidInput            400, 422 (invalid_input, invalid_request)
     │    │    └── UnsupportedMedia   415
     │    ├── Unauthorized            401
     │    ├── Forbidden               403 (an operator's action with a tenant's own key)
     │    ├── NotFound                404
     │    ├── Conflict                409
     │    ├── PayloadTooLarge         413
     │    ├── QueueFull               429
     │    └── Unavailable             503
     ├── JobFailed               wait()/run(): the job ended failed, canceled or expired; .job
     ├── WaitTimeout             wait()/run(): the job had not ended in time (a TimeoutError too); .job
     └── WebhookVerificationError  verify_webhook(): not a genuine, fresh delivery
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

TERMINAL = ("finished", "failed", "canceled", "expired")
# A bulk batch's statuses once it ended (every item has its result line).
BATCH_ENDED = ("finished", "canceled")


# Errors.


class InferqError(Exception):
    """Base of every error the SDK raises."""


class TransportError(InferqError):
    """The API could not be reached (connection refused, timed out, cut off), after retries."""


class APIError(InferqError):
    """The API answered with an error body ``{"error": {"code", "message"}}``."""

    def __init__(self, message: str, *, status: int, code: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.message = message
        self.status = status
        self.code = code
        # Seconds the API asked to wait before trying again (429, 503), when it said so.
        self.retry_after_s = retry_after_s


class InvalidInput(APIError):
    """The request was refused as unusable (422, 400)."""


class UnsupportedMedia(InvalidInput):
    """Not a type the model takes (415)."""


class Unauthorized(APIError):
    """An API key is needed, and it was missing or wrong (401)."""


class Forbidden(APIError):
    """The key is good but not an operator's (403): a rollout, a restore or a reload changes what every tenant gets."""


class NotFound(APIError):
    """No such model or job, or its result expired (404)."""


class Conflict(APIError):
    """The job's state forbids it, such as canceling an ended job (409)."""


class PayloadTooLarge(APIError):
    """The body is over the API's limit (413)."""


class QueueFull(APIError):
    """The model's queue is full (429); ``retry_after_s`` says when to try again."""


class Unavailable(APIError):
    """The API's job store is unreachable (503); ``retry_after_s`` says when to try again."""


class JobFailed(InferqError):
    """The job ended without a result: failed, canceled or expired. ``job`` is its view."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.id} {job.status}: {job.error or 'no reason given'}")
        self.job = job


class WaitTimeout(InferqError, TimeoutError):
    """The job had not ended within the time given; it goes on. ``job`` is its last view."""

    def __init__(self, job: Job, timeout_s: float) -> None:
        super().__init__(f"job {job.id} is still {job.status} after {timeout_s:g} s")
        self.job = job


class WebhookVerificationError(InferqError):
    """A webhook delivery whose signature does not match, or whose timestamp is missing, stale or in the future."""


_BY_CODE: dict[str, type[APIError]] = {
    "invalid_input": InvalidInput,
    "invalid_request": InvalidInput,
    "unsupported_media_type": UnsupportedMedia,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "payload_too_large": PayloadTooLarge,
    "queue_full": QueueFull,
    "unavailable": Unavailable,
}
_BY_STATUS = {400: InvalidInput, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict}
_BY_STATUS |= {413: PayloadTooLarge}
_BY_STATUS |= {415: UnsupportedMedia, 422: InvalidInput, 429: QueueFull, 503: Unavailable}


def error_class(code: str, status: int) -> type[APIError]:
    """The exception for an API error: by its code, else by its HTTP status."""
    return _BY_CODE.get(code) or _BY_STATUS.get(status) or APIError


# Results, mirroring the API's schemas (api/schemas.py); fields the API adds later are ignored.

T = TypeVar("T")


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def _iso(value: datetime | None) -> str | None:
    # As the API writes times: ISO 8601, UTC as "Z".
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def build(cls: type[T], data: Mapping[str, Any], **parsed: Any) -> T:
    """A result dataclass from the API's JSON, ``parsed`` values replacing raw ones; unknown fields are ignored."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{key: value for key, value in data.items() if key in names} | parsed)


@dataclass(frozen=True)
class JobUrls:
    """Where to read, stream and cancel a job."""

    self: str
    events: str
    cancel: str


@dataclass(frozen=True)
class WebhookAttempt:
    """One delivery attempt of a job's webhook."""

    attempt: int
    at: str | None = None
    status_code: int | None = None
    response_bytes: int | None = None
    error: str | None = None
    outcome: str | None = None
    next_attempt_in_s: float | None = None


@dataclass(frozen=True)
class WebhookInfo:
    """A job's webhook and its delivery attempts so far."""

    url: str
    attempts: list[WebhookAttempt] = field(default_factory=list)


@dataclass(frozen=True)
class Job:
    """A job as the API shows it; a just-submitted job carries only its id, status, model, times queued and urls."""

    id: str
    model: str
    status: str
    version: int = 1  # the model's version the job was routed to, and runs on
    created_at: datetime | None = None
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    batch_size: int | None = None
    worker: str | None = None
    weights_sha256: str | None = None  # the weights that answered, once it ran
    timings_ms: dict[str, float] | None = None
    result: Any = None
    error: str | None = None
    expires_at: datetime | None = None
    webhook: WebhookInfo | None = None
    urls: JobUrls | None = None

    @property
    def done(self) -> bool:
        """Whether the job ended: finished, failed, canceled or expired."""
        return self.status in TERMINAL

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Job:
        """A job from the API's JSON view."""
        times = {name: _time(data.get(name)) for name in ("created_at", "enqueued_at", "started_at", "ended_at")}
        hook = data.get("webhook")
        webhook = None
        if isinstance(hook, Mapping):
            attempts = [build(WebhookAttempt, attempt) for attempt in hook.get("attempts") or []]
            webhook = WebhookInfo(hook["url"], attempts)
        urls = build(JobUrls, data["urls"]) if isinstance(data.get("urls"), Mapping) else None
        expires = _time(data.get("expires_at"))
        return build(cls, data, **times, expires_at=expires, webhook=webhook, urls=urls)

    def to_dict(self) -> dict[str, Any]:
        """The job as JSON-ready data in the API's field names: times as ISO 8601 strings, every field present."""
        data = asdict(self)
        for name in ("created_at", "enqueued_at", "started_at", "ended_at", "expires_at"):
            data[name] = _iso(data[name])
        return data


@dataclass(frozen=True)
class Model:
    """A served model: its input spec, labels, batch limit, queue and live workers."""

    name: str
    description: str = ""
    handler: str = ""
    input: dict[str, Any] = field(default_factory=dict)
    labels: list[str] | None = None
    max_batch: int = 0
    queue: str = ""
    queue_length: int = 0
    # Jobs waiting per lane ("interactive", "bulk"); queue_length is their sum.
    queue_lengths: dict[str, int] = field(default_factory=dict)
    workers: int = 0
    versions: list[ModelVersion] = field(default_factory=list)
    # What its unpinned submits follow: traffic (percent per version), ramp, set_by ("config" or "api").
    rollout: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Model:
        """A model from the API's JSON."""
        return build(cls, data, versions=[build(ModelVersion, v) for v in data.get("versions") or []])


@dataclass(frozen=True)
class ModelVersion:
    """One version of a model: its state (loading, warming, ready, failed, draining, unavailable), the weights'
    SHA-256, the percent of unpinned submits it takes now, its workers and queues, and why it was rolled back, if it
    was."""

    version: int
    state: str
    reason: str | None = None
    weights_sha256: str | None = None
    share: float = 0.0
    workers: int = 0
    queue_lengths: dict[str, int] = field(default_factory=dict)
    rolled_back: dict[str, Any] | None = None


@dataclass(frozen=True)
class InvalidModel:
    """A model folder whose config is invalid, and why: left out, or (``serving``) served on with the last good
    config it had, until the file is fixed."""

    name: str
    error: str
    serving: bool = False


@dataclass(frozen=True)
class ModelList:
    """Every served model, and the model folders left out."""

    models: list[Model]
    invalid: list[InvalidModel]


@dataclass(frozen=True)
class Tenant:
    """The caller's tenant (its API key's): its name, weight, quotas (None: not limited) and their use now, e.g.
    ``use["jobs_per_minute"] == {"limit": 600, "used": 12, "retry_after_s": 0}``."""

    name: str
    weight: float
    quotas: dict[str, int | None]
    use: dict[str, Any]


@dataclass(frozen=True)
class BatchUrls:
    """Where to read, follow and cancel a bulk batch."""

    self: str
    results: str
    cancel: str


@dataclass(frozen=True)
class RefusedLine:
    """A line of an upload the API refused, by its number (from 1); it fails alone if it had a custom_id."""

    line: int
    error: str
    custom_id: str | None = None


@dataclass(frozen=True)
class Batch:
    """A bulk batch as the API shows it: status, item counts, rate; an upload's answer also lists refused lines."""

    id: str
    model: str
    status: str  # queued, running, finished or canceled
    version: int = 1  # the model's version every item of the batch runs on
    priority: str = "bulk"
    counts: dict[str, int] = field(default_factory=dict)  # total, queued, running, finished, failed, canceled
    created_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    items_per_s: float | None = None
    eta_s: float | None = None
    webhook: str | None = None
    urls: BatchUrls | None = None
    # Only in the answer to an upload: how many lines it refused, and the first of them.
    refused_count: int = 0
    refused: list[RefusedLine] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Items in the batch, each of which gets one result line (refused lines with a custom_id included)."""
        return self.counts.get("total", 0)

    @property
    def done(self) -> bool:
        """Whether the batch ended (finished or canceled): every item's result line is written."""
        return self.status in BATCH_ENDED

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Batch:
        """A batch from the API's JSON view."""
        times = {name: _time(data.get(name)) for name in ("created_at", "started_at", "ended_at")}
        urls = build(BatchUrls, data["urls"]) if isinstance(data.get("urls"), Mapping) else None
        refused = [build(RefusedLine, item) for item in data.get("refused") or []]
        return build(cls, data, **times, urls=urls, refused=refused)


@dataclass(frozen=True)
class BatchResult:
    """One item's result line: ``finished`` with its ``result``, or ``failed``/``canceled``/``expired``."""

    custom_id: str
    status: str
    result: Any = None
    error: str | None = None
    # The model's version that ran the item and its weights' SHA-256 (an item that never ran has neither).
    version: int | None = None
    weights_sha256: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchResult:
        """A result line from its JSON."""
        return build(cls, data)

    def to_dict(self) -> dict[str, Any]:
        """The line as the API writes it: ``result`` on a finished item, ``error`` where there is one."""
        data: dict[str, Any] = {"custom_id": self.custom_id, "status": self.status}
        if self.version is not None:
            data |= {"version": self.version, "weights_sha256": self.weights_sha256}
        if self.status == "finished":
            data["result"] = self.result
        if self.error is not None:
            data["error"] = self.error
        return data


# Retries.


@dataclass(frozen=True)
class Retry:
    """How often and how patiently requests are retried: exponential backoff with jitter, at least Retry-After."""

    attempts: int = 4  # tries in all
    backoff_s: float = 0.5
    # A Retry-After beyond this is not waited for: the error reaches the caller, who may try later.
    max_delay_s: float = 30.0

    def delay_s(self, attempt: int, retry_after: str | None = None) -> float | None:
        """Seconds before try ``attempt + 1``; None when ``Retry-After`` asks for longer than ``max_delay_s``."""
        backoff = min(self.backoff_s * 2 ** (attempt - 1), self.max_delay_s) * random.uniform(0.5, 1.0)
        asked = retry_after_s(retry_after)
        if asked is None:
            return backoff
        return None if asked > self.max_delay_s else max(asked, backoff)


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` header as seconds from now: delay-seconds or an HTTP date; None if absent or unreadable."""
    if not value:
        return None
    if value.strip().isascii() and value.strip().isdigit():  # isdigit() alone: "²" (float() refuses it)
        return float(value.strip())
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
