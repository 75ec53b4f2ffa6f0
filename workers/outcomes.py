"""How each job of a finished batch ended, as the finish script takes it: a single job's result or failure,
or a bulk chunk's result lines (each item ended or failed alone), with what each item adds to its model's metrics."""

from __future__ import annotations

import json
from typing import Any

from rq.utils import now

from inferq.shared import metrics
from inferq.shared.jobs import ended_view
from inferq.shared.lifecycle.claims import Claimed
from inferq.shared.lifecycle.finish import Outcome
from inferq.shared.lifecycle.info import F, JobInfo, at_finish
from inferq.shared.models import ModelConfig
from inferq.shared.settings import Settings
from inferq.workers.running import Item


def chunk_outcome(
    items: list[Item], batch_size: int, config: ModelConfig, worker_name: str, settings: Settings
) -> Outcome:
    """A bulk chunk ends finished, with one result line per item, ended or failed alone, each naming the version
    that ran it."""
    job = items[0].job
    model, weights = config.served, items[0].info.get(F.WEIGHTS)
    lines = []
    for item in items:
        line: dict[str, Any] = {"custom_id": item.custom_id, "version": config.version, "weights_sha256": weights}
        if item.error is None:
            line |= {"status": "finished", "result": item.output}
        else:
            line |= {"status": "failed", "error": item.error}
        lines.append(json.dumps(line, separators=(",", ":")))
    failed = sum(item.error is not None for item in items)
    moved = {"running": -len(items), "finished": len(items) - failed, "failed": failed}
    info = at_finish(batch_size, worker_name, items[0].info[F.INFERENCE_MS], weights=items[0].info.get(F.WEIGHTS))
    ttl = job.result_ttl if job.result_ttl is not None else settings.result_ttl_s
    summary = {"finished": len(items) - failed, "failed": failed}
    observed: metrics.Increments = {}
    notes: list[str] = []
    for item in items:
        observe(observed, item)
        if item.error is not None and len(notes) < 3:
            notes.append(_failure_note(item))
    return Outcome(job, True, summary, int(ttl), info, model, lines, moved, observed, notes)


def outcome_of(item: Item, batch_size: int, model: str, worker_name: str, settings: Settings) -> Outcome:
    """How the job ended, for the finish script."""
    job = item.job
    # The fields the finish adds to the info hash: the rest are there already (the start read them).
    queue_ms = (job.started_at - job.enqueued_at).total_seconds() * 1000.0 if job.enqueued_at else None
    info = at_finish(batch_size, worker_name, item.info[F.INFERENCE_MS], queue_ms, item.error, item.info.get(F.WEIGHTS))
    observed: metrics.Increments = {}
    observe(observed, item)
    if item.error is None:
        ttl = job.result_ttl if job.result_ttl is not None else settings.result_ttl_s
        return Outcome(
            job,
            True,
            item.output,
            int(ttl),
            info,
            model,
            metrics=observed,
            value_json=item.output_json,
            view=_view(job, "finished", info, int(ttl), item.output_json),
        )
    ttl = job.failure_ttl or settings.failure_ttl_s
    note = _failure_note(item)
    value = item.traceback or item.error
    view = _view(job, "failed", info, int(ttl), None)
    return Outcome(job, False, value, int(ttl), info, model, metrics=observed, failures=[note], view=view)


def _failure_note(item: Item) -> str:
    """A failed item's entry in its model's recent failures, under its job's tenant (shown to that tenant only)."""
    assert item.error is not None
    return metrics.failure_record(metrics.failure_class(item.error), item.error, tenant=item.job.info.get(F.TENANT))


def observe(acc: metrics.Increments, item: Item) -> None:
    """What one item adds to its model's metrics when its job ends (counted only if it ends here)."""
    job = item.job
    ended_at = job.ended_at or now()
    queued_s = (job.started_at - job.enqueued_at).total_seconds() if job.enqueued_at else None
    end_to_end_s = (ended_at - job.enqueued_at).total_seconds() if job.enqueued_at else None
    inference_s = float(item.info.get(F.INFERENCE_MS) or 0.0) / 1000.0
    status, reason = "finished", None
    if item.error is not None:
        status, reason = "failed", metrics.failure_class(item.error)
    tenant = job.info.get(F.TENANT)  # its tenant label on /metrics
    metrics.job_increments(acc, status, queued_s, inference_s, end_to_end_s, reason=reason, tenant=tenant)


def _view(job: Claimed, status: str, info: dict[str, str], ttl_s: int, result_json: str | None) -> str | None:
    """The view published with the job's end event, for a submit waiting on it (``shared.jobs.ended_view``).

    Only then: other jobs' events stay small. A job with a webhook is left out (its view lists the delivery
    attempts, which only a read can tell), and its waiting request reads the view as before.
    """
    if job.info.get(F.WAITED) != "1" or F.WEBHOOK in job.info or job.ended_at is None:
        return None
    ended = JobInfo.of(info)
    return ended_view(status, job.enqueued_at, job.started_at, job.ended_at, ended, ttl_s, result_json).decode()
