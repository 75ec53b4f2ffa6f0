"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from api.deps import State

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "Redis unreachable"}})
async def readyz(state: State) -> dict[str, str]:
    """Redis answers (503 otherwise)."""
    await run_in_threadpool(state.redis.ping)
    return {"status": "ready"}
