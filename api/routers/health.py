"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel
from redis.exceptions import RedisError

from inferq.api.deps import AppState, State
from inferq.api.routers.models import invalid_models
from inferq.shared import connections, durability, shards
from inferq.shared.errors import Unavailable

router = APIRouter(tags=["health"])


class Readiness(BaseModel):
    # "ready", or "degraded" while a served model has no live worker (its jobs are accepted and wait) or its Redis
    # is unavailable (a Redis other than INFERQ_REDIS_URL's: see ``unavailable``). The API itself can serve (200)
    # either way; 503 means it cannot (INFERQ_REDIS_URL's Redis unavailable).
    status: str
    # Live workers per served model (RQ's worker registry); jobs for a model with 0 wait in its queue.
    workers: dict[str, int]
    models_without_workers: list[str]
    # Model folders whose config.json failed its checks (GET /v1/models says why): not served.
    invalid_models: list[str]
    # What a 202 promises (INFERQ_DURABILITY); with "replica", the replicas connected to the primary now.
    durability: str
    replicas: int | None = None
    # Served models whose Redis (a shard of INFERQ_REDIS_SHARDS) is unavailable now, with why: their submits answer
    # 503, the other models serve. Their workers are not counted above.
    unavailable: dict[str, str] = {}


@router.get("/healthz")
async def healthz(state: State) -> dict[str, str]:
    """The process is up; what a 202 promises (INFERQ_DURABILITY)."""
    return {"status": "ok", "durability": state.settings.durability}


def _readiness(state: AppState) -> Readiness:
    """INFERQ_REDIS_URL's Redis must answer (and acknowledge as INFERQ_DURABILITY promises), else 503; another one
    that does not leaves only its own models unavailable, each shown so."""
    replicas: int | None = None
    down: dict[str, str] = {}  # shard -> why
    for name, shard in sorted(state.shards.items()):
        try:
            shard.redis.ping()
            count, reason = durability.readiness(shard.redis, state.settings)
        except RedisError as exc:
            if name == shards.DEFAULT or not connections.is_unavailable(exc):
                raise
            down[name] = f"is unavailable: {connections.why_unavailable(exc)}"
            continue
        if reason is not None:
            if name == shards.DEFAULT:
                raise Unavailable(reason)
            down[name] = f"cannot acknowledge: {reason}"
        if count is not None:
            replicas = count if replicas is None else min(replicas, count)
    up = [n for n, c in sorted(state.models.items()) if (c.redis or shards.DEFAULT) not in down]
    counts = state.counts(up)
    unavailable = counts.unavailable | {
        n: f"its Redis ({c.redis!r}) {down[c.redis]}" for n, c in state.models.items() if c.redis in down
    }
    without = [name for name, count in counts.workers.items() if not count]
    return Readiness(
        status="degraded" if without or unavailable else "ready",
        workers=counts.workers,
        models_without_workers=without,
        invalid_models=sorted(invalid_models(state)),
        durability=state.settings.durability,
        replicas=replicas,
        unavailable=dict(sorted(unavailable.items())),
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
