"""The model repository as the API shows it, with each model's live workers and the configs left out."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel
from rq.serializers import JSONSerializer
from rq.worker import Worker

from inferq.api.auth import require_key
from inferq.api.deps import AppState, Model, State
from inferq.api.schemas import ERRORS, ModelPublic
from inferq.shared import keys
from inferq.shared.models import ModelConfig
from inferq.shared.rqjson import JSONJob, JSONQueue

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[Depends(require_key)])


class ModelServed(ModelPublic):
    # Workers registered on the model's queue (RQ's registry): 0 means its jobs wait until one starts.
    workers: int
    # Jobs waiting per lane (a bulk batch's chunk counts once); queue_length is their sum.
    queue_lengths: dict[str, int]


class InvalidModel(BaseModel):
    name: str
    error: str


class ModelListing(BaseModel):
    models: list[ModelServed]
    # Folders in the model repository whose config.json failed its checks: not served.
    invalid: list[InvalidModel]


def invalid_models(state: AppState) -> dict[str, str]:
    """The repository's folders left out at start, with why (load_model_configs records them)."""
    return dict(getattr(state.models, "invalid", {}))


def live_workers(state: AppState, names: list[str]) -> dict[str, int]:
    """How many workers RQ has registered on each model's queue; one that stopped cleanly has unregistered."""
    counts = {}
    for name in names:
        queue = state.for_model(state.models[name]).queues.get(keys.queue_name(name))
        workers = Worker.all(queue=queue, job_class=JSONJob, queue_class=JSONQueue, serializer=JSONSerializer)
        counts[name] = len(workers)
    return counts


def _public(config: ModelConfig, lengths: dict[str, int], workers: int) -> ModelServed:
    return ModelServed(
        name=config.name,
        description=config.description,
        handler=config.handler,
        input=config.input.model_dump(mode="json", by_alias=True),
        labels=config.labels,
        max_batch=config.max_batch,
        queue=keys.queue_name(config.name),
        queue_length=sum(lengths.values()),
        queue_lengths=lengths,
        workers=workers,
    )


def _status(state: AppState, names: list[str]) -> tuple[list[dict[str, int]], dict[str, int]]:
    """Each model's queue length per lane, read from the Redis that carries it, and its live workers."""
    by_name: dict[str, dict[str, int]] = {}
    for shard, placed in state.placed():
        mine = [name for name in placed if name in names]
        if not mine:
            continue
        with shard.redis.pipeline(transaction=False) as pipe:
            for name in mine:
                for lane in keys.LANES:
                    pipe.llen(shard.queues.get(keys.queue_name(name, lane)).key)
            flat = [int(n) for n in pipe.execute()]
        lanes = len(keys.LANES)
        for at, name in zip(range(0, len(flat), lanes), mine, strict=True):
            by_name[name] = dict(zip(keys.LANES, flat[at : at + lanes], strict=True))
    return [by_name[name] for name in names], live_workers(state, names)


@router.get("", response_model=ModelListing)
async def list_models(state: State) -> ModelListing:
    """Every model this deployment serves, with its queue length and live workers; and the configs left out."""
    names = sorted(state.models)
    lengths, workers = await run_in_threadpool(_status, state, names)
    return ModelListing(
        models=[_public(state.models[n], k, workers[n]) for n, k in zip(names, lengths, strict=True)],
        invalid=[InvalidModel(name=n, error=e) for n, e in sorted(invalid_models(state).items())],
    )


@router.get("/{model}", response_model=ModelServed, responses=ERRORS)
async def get_model(config: Model, state: State) -> ModelServed:
    """One model: its inputs, labels, max batch, queue length and live workers."""
    (length,), workers = await run_in_threadpool(_status, state, [config.name])
    return _public(config, length, workers[config.name])
