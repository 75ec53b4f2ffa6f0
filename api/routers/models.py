"""The model repository as the API shows it, with each model's live workers and the configs left out."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel
from rq.serializers import JSONSerializer
from rq.worker import Worker

from inferq.api.auth import require_key
from inferq.api.deps import AppState, Model, State
from inferq.api.schemas import ERRORS, ModelPublic
from inferq.api.versions import shares_of
from inferq.shared import keys
from inferq.shared.errors import NotFound
from inferq.shared.models import ModelConfig
from inferq.shared.rqjson import JSONJob, JSONQueue
from inferq.shared.versions import RolledBack, VersionState, read_rollbacks, read_states, restore

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[Depends(require_key)])


class RolledBackView(BaseModel):
    reason: str
    at: str | None


class VersionServed(BaseModel):
    version: int
    # loading / warming (a worker is starting it), ready (a live worker serves it), failed (its load or warm-up
    # failed: ``reason`` says why; it gets no job), unavailable (no worker, none starting).
    state: str
    reason: str | None = None
    # The SHA-256 of its weights, as its worker read them (a job's view names the one that answered it).
    weights_sha256: str | None = None
    # Percent of unpinned submits it takes now (the model's rollout.traffic among the ready versions).
    share: float
    workers: int
    queue_lengths: dict[str, int]
    # Set while the system has rolled it back (its jobs failed too often, or its warm-up failed on a new worker):
    # it takes no unpinned submit until restored (POST .../versions/{v}/restore) or a worker loads other weights.
    rolled_back: RolledBackView | None = None


class ModelServed(ModelPublic):
    # Workers registered on the model's queues (RQ's registry), all versions: 0 means its jobs wait until one starts.
    workers: int
    # Jobs waiting per lane, all versions (a bulk batch's chunk counts once); queue_length is their sum.
    queue_lengths: dict[str, int]
    # Each version (a model without versions has one, 1): the highest's input, labels and max batch are shown above.
    versions: list[VersionServed]


class InvalidModel(BaseModel):
    name: str
    error: str


class ModelListing(BaseModel):
    models: list[ModelServed]
    # Folders (or versions, as model@version) in the model repository whose config.json failed its checks: not served.
    invalid: list[InvalidModel]


def invalid_models(state: AppState) -> dict[str, str]:
    """The repository's folders left out at start, with why (load_model_configs records them)."""
    return dict(state.models.invalid)


def live_workers(state: AppState, names: list[str]) -> dict[str, int]:
    """How many workers RQ has registered on each served name's queue; one that stopped cleanly has unregistered."""
    counts = {}
    for name in names:
        queue = state.for_model(state.models[name]).queues.get(keys.queue_name(name))
        workers = Worker.all(queue=queue, job_class=JSONJob, queue_class=JSONQueue, serializer=JSONSerializer)
        counts[name] = len(workers)
    return counts


def _version(
    config: ModelConfig,
    lengths: dict[str, int],
    workers: int,
    told: VersionState | None,
    share: float,
    rolled_back: RolledBack | None,
) -> VersionServed:
    if workers:
        state, reason = "ready", None
    elif told is not None and told.state != "ready":
        state, reason = told.state, told.reason
    else:
        state, reason = "unavailable", None
    return VersionServed(
        version=config.version,
        state=state,
        reason=reason,
        weights_sha256=told.weights_sha256 if told is not None else None,
        share=round(share * 100, 3),
        workers=workers,
        queue_lengths=lengths,
        rolled_back=None if rolled_back is None else RolledBackView(reason=rolled_back.reason, at=_iso(rolled_back.at)),
    )


def _iso(epoch: float | None) -> str | None:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z") if epoch is not None else None


def _public(config: ModelConfig, versions: list[VersionServed]) -> ModelServed:
    lengths = {lane: sum(v.queue_lengths[lane] for v in versions) for lane in keys.LANES}
    return ModelServed(
        name=config.name,
        description=config.description,
        handler=config.handler,
        input=config.input.model_dump(mode="json", by_alias=True),
        labels=config.labels,
        max_batch=config.max_batch,
        queue=keys.queue_name(config.served),
        queue_length=sum(lengths.values()),
        queue_lengths=lengths,
        workers=sum(v.workers for v in versions),
        versions=versions,
    )


def _status(state: AppState, names: list[str]) -> tuple[list[dict[str, int]], dict[str, int]]:
    """Each served name's queue length per lane, read from the Redis that carries it, and its live workers."""
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


async def _served(state: AppState, models: list[str]) -> list[ModelServed]:
    """Each model with its versions' state, share, workers and queues."""
    served = [c.served for m in models for c in state.versions.versions(m).values()]
    lengths, workers = await run_in_threadpool(_status, state, served)
    by_served = dict(zip(served, lengths, strict=True))
    out = []
    for model in models:
        configs = state.versions.versions(model)
        shard = state.for_model_name(model)
        told = await read_states(shard.aredis, [c.served for c in configs.values()])
        rollbacks = await read_rollbacks(shard.aredis, [c.served for c in configs.values()])
        ready = {v for v, c in configs.items() if workers[c.served]}
        rolled = {v for v, c in configs.items() if rollbacks[c.served]}
        rollout = configs[max(configs)].rollout
        ramp = rollout.ramp if rollout is not None else None
        started = told[configs[ramp.version].served] if ramp is not None and ramp.version in configs else None
        since = time.time() - started.ready_since if started is not None and started.ready_since else None
        shares = shares_of(configs, ready, rolled, since) if ready else {}
        total = sum(shares.values()) or 1.0
        versions = [
            _version(
                c,
                by_served[c.served],
                workers[c.served],
                told[c.served],
                shares.get(v, 0.0) / total,
                rollbacks[c.served],
            )
            for v, c in configs.items()
        ]
        out.append(_public(configs[max(configs)], versions))
    return out


@router.get("", response_model=ModelListing)
async def list_models(state: State) -> ModelListing:
    """Every model this deployment serves, with its versions, queue lengths and live workers; and the configs left
    out."""
    return ModelListing(
        models=await _served(state, state.models.models()),
        invalid=[InvalidModel(name=n, error=e) for n, e in sorted(invalid_models(state).items())],
    )


class Reloaded(BaseModel):
    # Served names (model, or model@version past 1) the repository gained, lost or changed, and those now invalid.
    added: list[str]
    removed: list[str]
    changed: list[str]
    invalid: list[str]


@router.post("/reload", response_model=Reloaded)
async def reload_models(state: State) -> Reloaded:
    """Read the model repository again now, as the API also does by itself when it changes (INFERQ_MODELS_POLL_S):
    new models and versions are served, removed ones refused, without a restart. Workers are started apart
    (`inferq up` does it; elsewhere, start `inferq worker --model NAME` for each new one)."""
    changes = await run_in_threadpool(state.reload)
    log.info("model repository read again by request: %s", changes)
    return Reloaded(**changes)


@router.get("/{model}", response_model=ModelServed, responses=ERRORS)
async def get_model(config: Model, state: State) -> ModelServed:
    """One model: its inputs, labels, max batch, versions, queue length and live workers."""
    (served,) = await _served(state, [config.name])
    return served


@router.post("/{model}/versions/{version}/restore", response_model=ModelServed, responses=ERRORS)
async def restore_version(config: Model, version: int, state: State) -> ModelServed:
    """Lift a version's rollback: it takes its share of unpinned submits again (its failure window starts afresh)."""
    versions = state.versions.versions(config.name)
    if version not in versions:
        raise NotFound(f"model {config.name} has no version {version} (it has: {', '.join(map(str, versions))})")
    if not await restore(state.for_model(config).aredis, versions[version].served):
        raise NotFound(f"version {version} of model {config.name} is not rolled back")
    log.info("model %s version %d restored by request: it takes its share again", config.name, version)
    state.versions.forget(config.name)
    (served,) = await _served(state, [config.name])
    return served
