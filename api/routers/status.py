"""The live status page (``GET /``, static files in ``api/static``) and the JSON it polls (``GET /v1/status``)."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from inferq.api.auth import require_key
from inferq.api.deps import AppState, State
from inferq.shared import keys, metrics
from inferq.shared.lifecycle import census

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
# The charts' span, and the span of the page's throughput figure.
HISTORY_WINDOWS = 30
RATE_WINDOWS = 6

router = APIRouter(tags=["status"])


class Quantiles(BaseModel):
    """From the histogram buckets of the last windows, as Prometheus's histogram_quantile; null when empty."""

    p50: float | None
    p95: float | None


class WindowPoint(BaseModel):
    start: float = Field(description="window start, epoch seconds")
    ended: float = Field(description="jobs that ended in the window, any status")
    failed: float
    throughput_per_s: float = Field(description="items a worker ran (finished or failed) per second")
    mean_batch_size: float | None
    queued_p95_s: float | None
    inference_p95_s: float | None


class RecentFailure(BaseModel):
    at: float = Field(description="epoch seconds")
    reason: str = Field(description="the failure's class, as in inferq_job_failures_total")
    error: str = Field(description="the readable reason the job view shows")


class ModelStatus(BaseModel):
    name: str
    input_kind: str
    queue_depth: dict[str, int] = Field(description="jobs waiting, per lane")
    oldest_age_s: dict[str, float] = Field(description="age of the oldest waiting job, per lane (0 when empty)")
    workers: dict[str, int] = Field(description="live workers serving the model: busy, idle")
    throughput_per_s: float = Field(
        description="items a worker ran (finished or failed) per second over the last minute;"
        " canceled and expired items never ran and do not count"
    )
    mean_batch_size: float | None = Field(description="over the charts' span")
    queued_s: Quantiles
    inference_s: Quantiles
    end_to_end_s: Quantiles
    ended_total: dict[str, float] = Field(description="jobs ended by status, as inferq_jobs_ended_total")
    series: list[WindowPoint] = Field(description="the last complete windows, oldest first")
    failures: list[RecentFailure] = Field(description="the latest failures, newest first")
    rolled_back: str | None = Field(
        default=None, description="why the system rolled this version back, while it stands (it takes no unpinned job)"
    )
    draining: bool = Field(
        default=False,
        description="removed from the repository: its workers serve its queued jobs, then stop (it takes no new job)",
    )


class ClusterStatus(BaseModel):
    generated_at: float
    window_s: int
    models: list[ModelStatus]
    webhooks: dict[str, float] = Field(description="webhook delivery attempts by outcome")
    durability: str = Field(description="what a 202 promises (INFERQ_DURABILITY): async, replica or fsync")


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    """The status page and playground; its data comes from /v1/status and the public job routes."""
    return FileResponse(STATIC_DIR / "index.html")


@router.get("/v1/status", response_model=ClusterStatus, dependencies=[Depends(require_key)])
async def status(state: State) -> ClusterStatus:
    """Each model's queues, workers, throughput, batch fill, queue and inference time quantiles, charts' data
    over the last minutes and its latest failures: what the status page at ``/`` shows."""
    return await run_in_threadpool(_status, state)


def _quantiles(fields: dict[str, float], name: str) -> Quantiles:
    hist = metrics.histogram(fields, name, metrics.TIME_BUCKETS_S)
    return Quantiles(p50=hist.quantile(0.5), p95=hist.quantile(0.95))


def _point(start: int, fields: dict[str, float]) -> WindowPoint:
    ended = sum(metrics.counters(fields, metrics.ENDED).values())
    return WindowPoint(
        start=start,
        ended=ended,
        failed=sum(metrics.counters(fields, metrics.FAILED).values()),
        throughput_per_s=metrics.items_run(fields) / metrics.WINDOW_S,
        mean_batch_size=metrics.histogram(fields, "batch", metrics.BATCH_BUCKETS).mean,
        queued_p95_s=metrics.histogram(fields, "queued", metrics.TIME_BUCKETS_S).quantile(0.95),
        inference_p95_s=metrics.histogram(fields, "inference", metrics.TIME_BUCKETS_S).quantile(0.95),
    )


def _status(state: AppState) -> ClusterStatus:
    names = [name for _, placed in state.placed() for name in placed]
    now_s = time.time()
    cluster = census.read_clusters([(shard.redis, placed) for shard, placed in state.placed()], state.redis)
    recent: dict[str, census.Recent] = {}
    rolled_back: dict[str, bytes | None] = {}
    for shard, placed in state.placed():
        recent |= census.read_recent(shard.redis, placed, HISTORY_WINDOWS + 1, now_s)
        with shard.redis.pipeline(transaction=False) as pipe:
            for name in placed:
                pipe.hget(keys.rollback_key(name), "reason")
            rolled_back |= dict(zip(placed, pipe.execute(), strict=True))
    models = []
    for name in sorted(names):
        now = cluster.models[name]
        draining = name not in state.models
        if draining and not sum(now.workers.values()) and not sum(now.depth.values()):
            continue  # removed and drained (the API forgets it at its next look)
        history = recent[name]
        windows = [(start, metrics.fold_tenants(fields)) for start, fields in history.windows]  # the model as a whole
        complete = windows[:-1]  # the current window is still filling
        span = metrics.merge(fields for _, fields in windows)
        last_minute = metrics.merge(fields for _, fields in complete[-RATE_WINDOWS:])
        rate = metrics.items_run(last_minute) / (RATE_WINDOWS * metrics.WINDOW_S)
        models.append(
            ModelStatus(
                name=name,
                input_kind=state.config_of(name).input.kind,
                queue_depth=now.depth,
                oldest_age_s=now.oldest_age_s,
                workers=now.workers,
                throughput_per_s=rate,
                mean_batch_size=metrics.histogram(span, "batch", metrics.BATCH_BUCKETS).mean,
                queued_s=_quantiles(span, "queued"),
                inference_s=_quantiles(span, "inference"),
                end_to_end_s=_quantiles(span, "e2e"),
                ended_total=metrics.counters(metrics.fold_tenants(now.totals), metrics.ENDED),
                series=[_point(start, fields) for start, fields in complete],
                failures=[RecentFailure.model_validate(f) for f in history.failures],
                rolled_back=reason.decode() if (reason := rolled_back.get(name)) else None,
                draining=draining,
            )
        )
    return ClusterStatus(
        generated_at=now_s,
        window_s=metrics.WINDOW_S,
        models=models,
        webhooks=metrics.counters(cluster.webhooks, "outcome"),
        durability=state.settings.durability,
    )
