"""How each job of a finished batch ended, as the finish script takes it: a single job's result or failure,
or a bulk chunk's result lines (each item ended or failed alone)."""

from __future__ import annotations

import json
from typing import Any

from shared import metrics
from shared.lifecycle.store import Outcome
from shared.settings import Settings
from workers.batch_parts import observe
from workers.running import Item


def chunk_outcome(items: list[Item], batch_size: int, model: str, worker_name: str, settings: Settings) -> Outcome:
    """A bulk chunk ends finished, with one result line per item, ended or failed alone."""
    job = items[0].job
    lines = []
    for item in items:
        line: dict[str, Any] = {"custom_id": item.custom_id}
        if item.error is None:
            line |= {"status": "finished", "result": item.output}
        else:
            line |= {"status": "failed", "error": item.error}
        lines.append(json.dumps(line, separators=(",", ":")))
    failed = sum(item.error is not None for item in items)
    moved = {"running": -len(items), "finished": len(items) - failed, "failed": failed}
    info = {"batch_size": str(batch_size), "worker": worker_name, "inference_ms": items[0].info["inference_ms"]}
    ttl = job.result_ttl if job.result_ttl is not None else settings.result_ttl_s
    summary = {"finished": len(items) - failed, "failed": failed}
    observed: metrics.Increments = {}
    notes: list[str] = []
    for item in items:
        observe(observed, item)
        if item.error is not None and len(notes) < 3:
            notes.append(metrics.failure_record(metrics.failure_class(item.error), item.error))
    return Outcome(job, True, summary, int(ttl), info, model, lines, moved, observed, notes)


def outcome_of(item: Item, batch_size: int, model: str, worker_name: str, settings: Settings) -> Outcome:
    """How the job ended, for the finish script."""
    job = item.job
    info = {**item.info, "batch_size": str(batch_size), "worker": worker_name}
    info.pop("content_type", None)
    if job.enqueued_at:
        info["queue_ms"] = f"{(job.started_at - job.enqueued_at).total_seconds() * 1000.0:.3f}"
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
        )
    info["error"] = item.error
    ttl = job.failure_ttl or settings.failure_ttl_s
    note = metrics.failure_record(metrics.failure_class(item.error), item.error)
    value = item.traceback or item.error
    return Outcome(job, False, value, int(ttl), info, model, metrics=observed, failures=[note])
