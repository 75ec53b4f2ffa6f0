"""What the lifecycle's script calls are given beside their keys: the metrics group, the webhook delivery
template, a bulk chunk's batch keys; and how their replies read. Shared by ``submit``, ``claims`` and ``finish``.
"""

from __future__ import annotations

import time
from typing import Any

from inferq.shared import keys, metrics
from inferq.shared.lifecycle import layout
from inferq.shared.settings import Settings

# What a client is told an RQ end status is.
TERMINAL_RQ = {"finished": "finished", "failed": "failed", "stopped": "failed", "canceled": "canceled"}


def delivery_args(settings: Settings) -> dict[str, Any]:
    """The scripts' ``@delivery`` argument: how an end's webhook delivery is queued (``layout.delivery_template``)."""
    return layout.delivery_template(settings.webhook_ttl_s, settings.webhook_timeout_s)


def metrics_args(at: float | None = None) -> dict[str, Any]:
    """The scripts' ``@metrics`` argument: totals TTL, window TTL, failures kept, their TTL, now."""
    now_s = time.time() if at is None else at
    return {
        "ttl": metrics.TOTALS_TTL_S,
        "window_ttl": metrics.WINDOW_TTL_S,
        "keep": metrics.FAILURES_KEPT,
        "failures_ttl": metrics.FAILURES_TTL_S,
        "now": repr(now_s),
    }


def metrics_keys(model: str, at: float | None = None) -> list[str]:
    """A model's metrics totals, its current window and its recent failures."""
    window = keys.metrics_window_key(model, metrics.window_start(at))
    return [keys.metrics_key(model), window, keys.metrics_failures_key(model)]


def text(value: bytes | str) -> str:
    """A script's reply value as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def batch_keys(job_id: str) -> list[str]:
    """A chunk's batch record, result lines and webhook delivery; for a single job its info key, untouched."""
    if keys.is_chunk(job_id):
        batch_id = keys.batch_of_chunk(job_id)
        return [keys.batch_key(batch_id), keys.batch_results_key(batch_id), layout.batch_delivery_key(batch_id)]
    return [keys.info_key(job_id)] * 3


def int_or_none(value: bytes | None) -> int | None:
    return int(value) if value else None
