"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from inferq.api.deps import AppState, State
from inferq.api.routers.models import invalid_models
from inferq.shared import durability, shards
from inferq.shared.errors import Unavailable

router = APIRouter(tags=["health"])


class Readiness(BaseModel):
    # "ready", or "degraded" while a served model has no live worker: its jobs are accepted and wait. The API
    # itself can serve (200) either way; 503 means it cannot (Redis unavailable).
    status: str
    # Live workers per served model (RQ's worker registry); jobs for a model with 0 wait in its queue.
    workers: dict[str, int]
    models_without_workers: list[str]
    # Model folders whose config.json failed its checks (GET /v1/models says why): not served.
    invalid_models: list[str]
    # What a 202 promises (INFERQ_DURABILITY); with "replica", the replicas connected to the primary now.
    durability: str
    replicas: int | None = None


@router.get("/healthz")
async def healthz(state: State) -> dict[str, str]:
    """The process is up; what a 202 promises (INFERQ_DURABILITY)."""
    return {"status": "ok", "durability": state.settings.durability}


def _readiness(state: AppState) -> Readiness:
    replicas: int | None = None
    for name, shard in sorted(state.shards.items()):
        shard.redis.ping()
        count, reason = durability.readiness(shard.redis, state.settings)
        if reason is not None:
            raise Unavailable(reason if name == shards.DEFAULT else f"Redis {name!r}: {reason}")
        if count is not None:
            replicas = count if replicas is None else min(replicas, count)
    workers = state.live_workers(sorted(state.models))
    without = [name for name, count in workers.items() if not count]
    return Readiness(
        status="degraded" if without else "ready",
        workers=workers,
        models_without_workers=without,
        invalid_models=sorted(invalid_models(state)),
        durability=state.settings.durability,
        replicas=replicas,
    )


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"description": "Redis unavailable, or INFERQ_DURABILITY=replica with too few replicas"}},
)
async def readyz(state: State) -> Readiness:
    """Redis answers and can acknowledge writes as INFERQ_DURABILITY promises (503 and why otherwise); which models
    have live workers, and which have none."""
    return await run_in_threadpool(_readiness, state)
