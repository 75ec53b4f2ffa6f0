"""The end of a batch: every result stored, registries moved, events published and webhooks queued, in one script.

The worker's last step (``claims`` holds the others); what its script is given beside its keys: ``calls``.
"""

from __future__ import annotations

from base64 import b64encode
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from redis.client import Pipeline
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.utils import current_timestamp, now, utcformat

from inferq.shared import durability, keys, metrics, tracing
from inferq.shared.lifecycle import calls, layout, scripts
from inferq.shared.lifecycle.claims import Claimed
from inferq.shared.lifecycle.layout import QueueKeys
from inferq.shared.lifecycle.lua import told
from inferq.shared.metrics import Increments
from inferq.shared.settings import Settings


@dataclass(frozen=True)
class Outcome:
    """How one job ended."""

    job: Claimed
    finished: bool
    value: Any  # the output, or the traceback
    ttl_s: int
    info: dict[str, str]
    model: str
    # A bulk chunk: its items' result lines, and the counts they move in the batch record.
    lines: list[str] | None = None
    moved: dict[str, int] | None = None
    # What the job adds to the model's metrics if it ends here (shared.metrics), and its failure records.
    metrics: Increments | None = None
    failures: list[str] | None = None
    # The output already encoded as JSON (the worker checks every output encodes): RQ's result is built from it.
    value_json: str | None = None
    view: str | None = None  # published with its end event, for a waiting request (shared.jobs.ended_view)


@dataclass(frozen=True)
class FinishCall:
    position: int


def finish(
    pipe: Pipeline,
    settings: Settings,
    qk: QueueKeys,
    outcomes: Sequence[Outcome],
    worker_name: str,
    worker_key: str,
    working_s: float,
    batch_metrics: Increments | None = None,
) -> FinishCall:
    """Queue the end of a batch into ``pipe``: results, registries, events and webhooks, atomically."""
    hk = layout.hooks()
    per_job, entries = [], []
    stamps: dict[datetime, str] = {}  # a batch's jobs share their end: its RQ timestamp, formatted once
    for outcome in outcomes:
        job = outcome.job
        per_job.append(
            [
                layout.job_key(job.id),
                keys.info_key(job.id),
                layout.result_key(job.id),
                keys.payload_key(job.id),
                keys.webhook_attempts_key(job.id),
                layout.delivery_key(job.id),
                *calls.batch_keys(job.id),
                keys.attempt_key(job.id),
            ]
        )
        entries.append(_entry(outcome, worker_name, pipe, stamps))
    # What the batch adds if every job ends here (the common case): the script adds it in one step, and
    # decodes a job's own increments (entry field `m`) only to recount a batch where some job did not end.
    total = metrics.merge([batch_metrics or {}, *(outcome.metrics for outcome in outcomes if outcome.metrics)])
    position = len(pipe)
    fixed = [qk.started, qk.finished, qk.failed, hk.queue, layout.QUEUES_SET, worker_key]
    fixed += calls.metrics_keys(keys.model_from_queue(qk.name))
    args = {
        "now": current_timestamp(),
        "channel": keys.EVENTS_CHANNEL,
        "worker": worker_name,
        "working_s": repr(working_s),
        "tracing": "1" if tracing.on() else "0",  # whether a job's attempt span is there to read
        "metrics": calls.metrics_args(),
        "batch_metrics": metrics.encode(batch_metrics or {}),
        "all_metrics": metrics.encode(total),
        "delivery": calls.delivery_args(settings),
        "jobs": entries,
    }
    scripts.FINISH(pipe, fixed, per_job, args, defer=durability.defers(settings))
    return FinishCall(position)


def finished(call: FinishCall, replies: list[Any]) -> tuple[list[str], list[str], list[bytes]]:
    """(vanished, superseded) job ids of a finish queued with ``finish``, and the end events it left to its caller
    (``durability.release``: published once a replica has the results)."""
    (vanished, superseded), events = told(replies[call.position])
    return [calls.text(i) for i in vanished], [calls.text(i) for i in superseded], events


def _entry(outcome: Outcome, worker_name: str, pipe: Pipeline, stamps: dict[datetime, str]) -> tuple[Any, ...]:
    job = outcome.job
    ended_at = job.ended_at or now()
    if outcome.finished and outcome.value_json is not None and outcome.value is not None:
        # What RQ's Result.serialize() writes for a success, without encoding the output a second time.
        serialized: dict[str, Any] = {
            "type": Result.Type.SUCCESSFUL.value,
            "worker_name": worker_name,
            "return_value": b64encode(outcome.value_json.encode()).decode(),
            "execution_id": job.execution_id,
            "execution_started_at": job.started_at.timestamp(),
            "execution_ended_at": ended_at.timestamp(),
        }
    else:
        serialized = Result(
            job.id,
            Result.Type.SUCCESSFUL if outcome.finished else Result.Type.FAILED,
            pipe,
            created_at=ended_at,
            return_value=outcome.value if outcome.finished else None,
            exc_string=None if outcome.finished else outcome.value,
            worker_name=worker_name,
            serializer=JSONSerializer,
            execution_id=job.execution_id,
            execution_started_at=job.started_at,
            execution_ended_at=ended_at,
        ).serialize()
    stamp = stamps.get(ended_at)
    if stamp is None:
        stamp = stamps[ended_at] = utcformat(ended_at)
    rare: dict[str, Any] = {}
    if outcome.lines is not None:
        rare |= {"lines": outcome.lines, "moved": outcome.moved}
    if outcome.failures:
        rare["f"] = outcome.failures
    # The script's columns (lua/finish.lua); only what few jobs have is JSON, the rest is read with no decoding.
    return (
        job.id,
        job.execution_id,
        "finished" if outcome.finished else "failed",
        int(outcome.ttl_s),
        stamp,
        outcome.model,
        {k: str(v) for k, v in serialized.items()},
        outcome.info,
        outcome.view or "",
        orjson.dumps(outcome.metrics).decode() if outcome.metrics else "",  # decoded only to recount
        orjson.dumps(rare).decode() if rare else "",
    )
