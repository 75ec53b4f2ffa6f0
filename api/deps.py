"""FastAPI dependencies: the process's Redis, queues, settings, models and event hub."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from api.events import EventHub
from shared.errors import NotFound
from shared.jobs import QueueCache
from shared.models import ModelConfig
from shared.settings import Settings


@dataclass
class AppState:
    """Everything a request needs, built once in the app's lifespan."""

    settings: Settings
    redis: Redis
    queues: QueueCache
    models: dict[str, ModelConfig]
    events: EventHub
    # The submit and read paths: no thread per request (FastAPI runs sync code in its threadpool).
    aredis: AsyncRedis


def state_of(request: Request) -> AppState:
    """The app's state, for code that has the request (one dependency fewer to solve per request)."""
    return request.app.state.inferq


# The dependencies are ``async def``: FastAPI runs a plain ``def`` one in its threadpool, a hop per request.
async def get_state(request: Request) -> AppState:
    return state_of(request)


State = Annotated[AppState, Depends(get_state)]


async def get_model(model: str, state: State) -> ModelConfig:
    config = state.models.get(model)
    invalid = getattr(state.models, "invalid", {})
    if config is None and model in invalid:
        raise NotFound(f"model {model!r} is not served: its config is invalid: {invalid[model]}")
    if config is None:
        raise NotFound(f"no model {model!r}; GET /v1/models lists them")
    return config


Model = Annotated[ModelConfig, Depends(get_model)]
