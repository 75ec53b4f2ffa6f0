"""inferq's own hash beside each RQ job (``keys.info_key``): its fields, named, written and read here.

The API writes a submit's fields (``at_submit``), an upload a bulk chunk's (``at_upload``); the worker's finish
adds the run's (``at_finish``); the scripts set the flags by the same names (``F.ANNOUNCED`` once an end was told,
``F.CANCELED``): ``lua.Script`` hands them these names as the Lua table ``F``. A job's view
reads the hash back typed (``JobInfo.of``). RQ's own job hash is another thing: ``rqhash`` reads that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class F:
    """The info hash's field names (the Lua scripts read them as ``F.MODEL`` and so on)."""

    # Written at submit.
    MODEL = "model"
    CONTENT_TYPE = "content_type"
    DEADLINE = "deadline"  # epoch seconds: a job still queued then never runs and reads as expired
    WEBHOOK = "webhook"
    OWNER = "owner"  # a hash of the submitting API key: only that key sees or cancels the job
    WAITED = "waited"  # "1": a request waits on the job's end, so the worker publishes its view with it
    TENANT = "tenant"  # the tenant whose key sent it (shared/tenants.py), when the deployment has tenants
    # Tracing on (shared/tracing.py): the submit span's W3C context, the parent of the job's spans everywhere.
    TRACEPARENT = "traceparent"
    TRACESTATE = "tracestate"
    # Written by the finish, tracing on: the attempt span that ended the job ("<traceparent> <start ns>", as
    # ``keys.attempt_key`` held it), the parent of its webhook's spans.
    ENDED_IN = "ended_in"
    # Written by the finish.
    WEIGHTS = "weights_sha256"  # the content hash of the weights that answered (shared/models.py weights_sha256)
    BATCH_SIZE = "batch_size"
    WORKER = "worker"
    QUEUE_MS = "queue_ms"
    INFERENCE_MS = "inference_ms"
    ERROR = "error"
    # Flags the scripts set.
    CANCELED = "canceled"
    ANNOUNCED = "announced"
    RESCUED = "rescued"  # times the job was put back after it was popped and never started (scripts.RESCUE)
    # A bulk chunk's own (upload.Upload writes them): its id, its batch, its items and their custom ids as the API
    # encoded them (JSON strings, one a line), and `counted` once its items count as running.
    ID = "id"
    BATCH = "batch"
    ITEMS = "items"
    CUSTOM_IDS = "custom_ids"
    COUNTED = "counted"


TIMINGS = (F.QUEUE_MS, F.INFERENCE_MS)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What a job's view reads of its info hash, typed."""

    model: str | None = None  # the served name: the model, and ``@<version>`` past version 1
    deadline: float | None = None
    webhook: str | None = None
    owner: str | None = None
    batch_size: int | None = None
    worker: str | None = None
    timings_ms: dict[str, float] | None = None
    error: str | None = None
    canceled: bool = False
    weights: str | None = None

    @classmethod
    def of(cls, raw: Mapping[str, str]) -> JobInfo:
        """The record of a decoded hash (missing fields read as None)."""
        timings = {name: float(raw[name]) for name in TIMINGS if name in raw}
        deadline = raw.get(F.DEADLINE)
        batch_size = raw.get(F.BATCH_SIZE)
        return cls(
            model=raw.get(F.MODEL) or None,
            deadline=float(deadline) if deadline else None,
            webhook=raw.get(F.WEBHOOK),
            owner=raw.get(F.OWNER),
            batch_size=int(batch_size) if batch_size is not None else None,
            worker=raw.get(F.WORKER) or None,
            timings_ms=timings or None,
            error=raw.get(F.ERROR) or None,
            canceled=bool(raw.get(F.CANCELED)),
            weights=raw.get(F.WEIGHTS) or None,
        )

    @property
    def ran(self) -> bool:
        """Whether a worker finished it (the finish writes the batch size)."""
        return self.batch_size is not None


def at_submit(
    model: str,
    content_type: str,
    deadline: float,
    webhook: str | None,
    owner: str | None,
    waited: bool,
    tenant: str | None = None,
    trace: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The fields a submit writes (``trace``: the submit span's ``traceparent`` and ``tracestate``)."""
    info = {F.MODEL: model, F.CONTENT_TYPE: content_type, F.DEADLINE: f"{deadline:.3f}"}
    if trace:
        info.update(trace)
    if tenant:
        info[F.TENANT] = tenant
    if webhook:
        info[F.WEBHOOK] = webhook
    if owner:
        info[F.OWNER] = owner
    if waited:
        info[F.WAITED] = "1"
    return info


def at_finish(
    batch_size: int,
    worker: str,
    inference_ms: str,
    queue_ms: float | None = None,
    error: str | None = None,
    weights: str | None = None,
) -> dict[str, str]:
    """The fields the finish adds (the rest are there already): what ran the job, on which weights, and how long it
    took."""
    info = {F.BATCH_SIZE: str(batch_size), F.WORKER: worker, F.INFERENCE_MS: inference_ms}
    if weights is not None:
        info[F.WEIGHTS] = weights
    if queue_ms is not None:
        info[F.QUEUE_MS] = f"{queue_ms:.3f}"
    if error is not None:
        info[F.ERROR] = error
    return info


def at_upload(
    chunk_id: str,
    model: str,
    batch_id: str,
    items: int,
    content_type: str,
    deadline: str,
    custom_ids: str,
    tenant: str | None = None,
) -> dict[str, Any]:
    """The fields a bulk chunk is staged with."""
    info: dict[str, Any] = {
        F.ID: chunk_id,
        F.MODEL: model,
        F.BATCH: batch_id,
        F.ITEMS: items,
        F.CONTENT_TYPE: content_type,
        F.DEADLINE: deadline,
        F.CUSTOM_IDS: custom_ids,
    }
    if tenant:
        info[F.TENANT] = tenant
    return info
