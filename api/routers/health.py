"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from api.deps import AppState, State
from api.routers.models import invalid_models, live_workers

router = APIRouter(tags=["health"])


class Readiness(BaseModel):
    status: str
    # Live workers per served model (RQ's worker registry); jobs for a model with 0 wait in its queue.
    workers: dict[str, int]
    models_without_workers: list[str]
    # Model folders whose config.json failed its checks (GET /v1/models says why): not served.
    invalid_models: list[str]


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


def _readiness(state: AppState) -> Readiness:
    state.redis.ping()
    workers = live_workers(state, sorted(state.models))
    return Readiness(
        status="ready",
        workers=workers,
        models_without_workers=[name for name, count in workers.items() if not count],
        invalid_models=sorted(invalid_models(state)),
    )


@router.get("/readyz", response_model=Readiness, responses={503: {"description": "Redis unreachable"}})
async def readyz(state: State) -> Readiness:
    """Redis answers (503 otherwise); which models have live workers, and which have none."""
    return await run_in_threadpool(_readiness, state)
