"""The model repository as the API shows it."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from api.auth import require_key
from api.deps import AppState, Model, State
from api.schemas import ERRORS, ModelList, ModelPublic
from shared import keys
from shared.models import ModelConfig

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[Depends(require_key)])


def _public(state: AppState, config: ModelConfig, queue_length: int) -> ModelPublic:
    return ModelPublic(
        name=config.name,
        description=config.description,
        handler=config.handler,
        input=config.input.model_dump(mode="json", by_alias=True),
        labels=config.labels,
        max_batch=config.max_batch,
        queue=keys.queue_name(config.name),
        queue_length=queue_length,
    )


def _lengths(state: AppState, names: list[str]) -> list[int]:
    with state.redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.llen(state.queues.get(keys.queue_name(name)).key)
        return [int(n) for n in pipe.execute()]


@router.get("", response_model=ModelList)
async def list_models(state: State) -> ModelList:
    """Every model this deployment serves, with its queue length."""
    names = sorted(state.models)
    lengths = await run_in_threadpool(_lengths, state, names)
    return ModelList(models=[_public(state, state.models[n], k) for n, k in zip(names, lengths, strict=True)])


@router.get("/{model}", response_model=ModelPublic, responses=ERRORS)
async def get_model(config: Model, state: State) -> ModelPublic:
    """One model: its inputs, labels, max batch and queue length."""
    (length,) = await run_in_threadpool(_lengths, state, [config.name])
    return _public(state, config, length)
