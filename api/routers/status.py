"""The live status page (``GET /``, static files in ``api/static``) and the JSON it polls (``GET /v1/status``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from inferq.api.auth import Caller, may_operate
from inferq.api.deps import AppState, State
from inferq.api.routers.tenants import TenantUse, use_of
from inferq.shared import keys, metrics
from inferq.shared.inputs import input_example
from inferq.shared.lifecycle import census
from inferq.shared.tenants import Quotas

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
    tenant: str | None = Field(default=None, description="the tenant whose job it was (null without tenants)")


class ModelStatus(BaseModel):
    name: str
    input_kind: str
    input_example: Any = Field(
        default=None,
        description='an "inputs" value the model takes, as the playground suggests it (from a json model\'s schema);'
        " null where its kind has none to show",
    )
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
    failures: list[RecentFailure] = Field(
        description="the latest failures, newest first (a tenant's key: only its own jobs')"
    )
    rolled_back: str | None = Field(
        default=None, description="why the system rolled this version back, while it stands (it takes no unpinned job)"
    )
    draining: bool = Field(
        default=False,
        description="removed from the repository: its workers serve its queued jobs, then stop (it takes no new job)",
    )
    unavailable: str | None = Field(
        default=None,
        description="why its Redis (a shard of INFERQ_REDIS_SHARDS) cannot be read now: its numbers are missing",
    )


class TenantStatus(BaseModel):
    name: str
    weight: float
    share: float | None = Field(
        description="its part of the items workers ran over the last minute, all models (null: none ran)"
    )
    throughput_per_s: float = Field(description="its items a worker ran per second over the last minute")
    ended_total: dict[str, float] = Field(description="its jobs ended by status, all models")
    in_flight: float = Field(description="its jobs and upload lines accepted and not yet ended (waiting or running)")
    quotas: Quotas
    use: TenantUse


class ClusterStatus(BaseModel):
    generated_at: float
    window_s: int
    models: list[ModelStatus]
    tenants: list[TenantStatus] = Field(
        default_factory=list,
        description="each configured tenant to an operator's key, only its own to a tenant's (none without"
        " INFERQ_TENANTS or INFERQ_API_KEYS)",
    )
    webhooks: dict[str, float] = Field(description="webhook delivery attempts by outcome")
    durability: str = Field(description="what a 202 promises (INFERQ_DURABILITY): async, replica or fsync")


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    """The status page and playground; its data comes from /v1/status and the public job routes."""
    return FileResponse(STATIC_DIR / "index.html")


@router.get("/v1/status", response_model=ClusterStatus)
async def status(request: Request, state: State, caller: Caller) -> ClusterStatus:
    """Each model's queues, workers, throughput, batch fill, queue and inference time quantiles, charts' data
    over the last minutes and its latest failures: what the status page at ``/`` shows. With API keys, a tenant's
    key sees of the tenants only its own (its row, its jobs' failures; the models as a whole, as /metrics shows
    anyone); an operator's key sees every tenant."""
    everyone = may_operate(request, caller)
    cluster, per_tenant = await run_in_threadpool(_status, state, None if everyone else caller.name)
    total = sum(rate for rate, _, _ in per_tenant.values()) or None
    for tenant in state.tenants.all if everyone else [caller]:
        rate, ended, accepted = per_tenant.get(tenant.name, (0.0, {}, 0.0))
        cluster.tenants.append(
            TenantStatus(
                name=tenant.name,
                weight=tenant.weight,
                share=None if total is None else rate / total,
                throughput_per_s=rate,
                ended_total=ended,
                in_flight=max(0.0, accepted - sum(ended.values())),
                quotas=tenant.quotas,
                use=await use_of(state, tenant),
            )
        )
    return cluster


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


def _per_tenant(
    recent: dict[str, census.Recent], totals: dict[str, dict[str, float]]
) -> dict[str, tuple[float, dict[str, float], float]]:
    """Each tenant's items run per second over the last minute, jobs ended by status and jobs accepted, all models
    together."""
    rates: dict[str, float] = {}
    ended: dict[str, dict[str, float]] = {}
    accepted: dict[str, float] = {}
    for name, history in recent.items():
        last_minute = metrics.merge(fields for _, fields in history.windows[:-1][-RATE_WINDOWS:])
        for tenant, fields in metrics.by_tenant(last_minute).items():
            rates[tenant] = rates.get(tenant, 0.0) + metrics.items_run(fields) / (RATE_WINDOWS * metrics.WINDOW_S)
        for tenant, fields in metrics.by_tenant(totals.get(name, {})).items():
            mine = ended.setdefault(tenant, {})
            for status, value in metrics.counters(fields, metrics.ENDED).items():
                mine[status] = mine.get(status, 0.0) + value
            accepted[tenant] = accepted.get(tenant, 0.0) + sum(metrics.counters(fields, metrics.ACCEPTED).values())
    return {
        tenant: (rates.get(tenant, 0.0), ended.get(tenant, {}), accepted.get(tenant, 0.0))
        for tenant in set(rates) | set(ended)
    }


def _unavailable(state: AppState, name: str, why: str) -> ModelStatus:
    """A model whose Redis cannot be read now: named, with why, and no numbers."""
    nothing = Quantiles(p50=None, p95=None)
    return ModelStatus(
        name=name,
        input_kind=state.config_of(name).input.kind,
        input_example=input_example(state.config_of(name).input),
        queue_depth=dict.fromkeys(keys.LANES, 0),
        oldest_age_s=dict.fromkeys(keys.LANES, 0.0),
        workers={"busy": 0, "idle": 0},
        throughput_per_s=0.0,
        mean_batch_size=None,
        queued_s=nothing,
        inference_s=nothing,
        end_to_end_s=nothing,
        ended_total={},
        series=[],
        failures=[],
        draining=name not in state.models,
        unavailable=why,
    )


def _status(
    state: AppState, only: str | None = None
) -> tuple[ClusterStatus, dict[str, tuple[float, dict[str, float], float]]]:
    """The cluster's status; ``only``: a tenant's name, whose jobs' failures alone are listed."""
    names = [name for _, placed in state.placed() for name in placed]
    now_s = time.time()
    cluster = census.read_clusters([(shard.redis, placed) for shard, placed in state.placed()], state.redis)
    recent: dict[str, census.Recent] = {}
    rolled_back: dict[str, bytes | None] = {}
    for shard, placed in state.placed():
        if any(name in cluster.unavailable for name in placed):
            continue  # that Redis is down: its models are shown unavailable, the rest as read
        recent |= census.read_recent(shard.redis, placed, HISTORY_WINDOWS + 1, now_s)
        with shard.redis.pipeline(transaction=False) as pipe:
            for name in placed:
                pipe.hget(keys.rollback_key(name), "reason")
            rolled_back |= dict(zip(placed, pipe.execute(), strict=True))
    models = []
    for name in sorted(names):
        if name in cluster.unavailable:
            models.append(_unavailable(state, name, cluster.unavailable[name]))
            continue
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
                input_example=input_example(state.config_of(name).input),
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
                failures=[
                    RecentFailure.model_validate(f) for f in history.failures if only is None or f.get("tenant") == only
                ],
                rolled_back=reason.decode() if (reason := rolled_back.get(name)) else None,
                draining=draining,
            )
        )
    status = ClusterStatus(
        generated_at=now_s,
        window_s=metrics.WINDOW_S,
        models=models,
        webhooks=metrics.counters(cluster.webhooks, "outcome"),
        durability=state.settings.durability,
    )
    return status, _per_tenant(recent, {name: m.totals for name, m in cluster.models.items()})
