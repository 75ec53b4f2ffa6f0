"""The model repository as the API shows it, with each model's live workers and the configs left out."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.json_schema import SkipJsonSchema

from inferq.api.auth import OPERATOR_ONLY, require_key
from inferq.api.deps import AppState, Model, State, described
from inferq.api.schemas import ERRORS, ModelPublic
from inferq.api.versions import NO_ROUTING, Routing, read_routing
from inferq.shared import keys
from inferq.shared.errors import NotFound
from inferq.shared.models import MAX_ENTRIES, VERSION_RE, ModelConfig, Ramp
from inferq.shared.versions import RolledBack, VersionState, clear_rollout, restore, set_rollout

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[Depends(require_key)])
# The routes that change what every tenant gets answer 403 to a tenant's own key (api/auth.py).
OPERATOR_ERRORS = {**ERRORS, 403: ERRORS[401]}


class RolledBackView(BaseModel):
    reason: str
    at: str | None


class VersionServed(BaseModel):
    version: int
    # loading / warming (a worker is starting it), ready (a live worker serves it), failed (its load or warm-up
    # failed: ``reason`` says why; it gets no job), draining (removed from the repository: its workers serve its
    # queued jobs, then stop; it gets no new job), unavailable (no worker, none starting).
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


class RolloutView(BaseModel):
    # Percent of unpinned submits per version (null: the highest version that serves takes them all).
    traffic: dict[int, float] | None
    ramp: Ramp | None
    # "config": the model's config.json; "api": set through PUT /v1/models/{m}/rollout, over the config's.
    set_by: Literal["config", "api"]
    # When the ramp started counting: its version first served (or, for one set later, when it was set).
    ramp_started_at: str | None = None
    # Why the rollout stored through the API cannot be used (stored by another version of inferq, or out of bounds):
    # the config's holds until DELETE clears it.
    unusable: str | None = None


# A version as a traffic key: what a version folder is named (1, 2, ...).
VersionKey = Annotated[str, StringConstraints(pattern=VERSION_RE.pattern)]
# Percent of unpinned submits; a version that takes none is left out.
Share = Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)]


def _some_versions_only(schema: dict[str, Any]) -> None:
    """Traffic's schema as it is checked: pydantic writes a dict's min_length and max_length as minLength and
    maxLength, which mean nothing for an object (schemathesis then sends {} as valid); and no key but a version's."""
    schema.pop("minLength", None)
    schema.pop("maxLength", None)
    schema |= {"minProperties": 1, "maxProperties": MAX_ENTRIES, "additionalProperties": False}


class RolloutUpdate(BaseModel):
    """A model's traffic and ramp, set over its config.json's for every API process (the config's rollback stays).
    Traffic, a ramp, or both; the schema says exactly what is taken (no null, no empty traffic)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"anyOf": [{"required": ["traffic"]}, {"required": ["ramp"]}]}
    )
    # Percent per version, e.g. {"1": 90, "2": 10}: versions not listed take none; a version not there yet takes
    # its share once it serves.
    traffic: Annotated[
        dict[VersionKey, Share] | SkipJsonSchema[None],
        Field(min_length=1, max_length=MAX_ENTRIES, json_schema_extra=_some_versions_only),
    ] = None
    # A version's share stepped up over time, e.g. {"version": 2, "steps": [10, 50, 100], "interval_s": 600}.
    ramp: Ramp | SkipJsonSchema[None] = None

    @model_validator(mode="before")
    @classmethod
    def _no_null(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(data.get(name, "") is None for name in ("traffic", "ramp")):
            raise ValueError("traffic and ramp are objects; leave one out rather than send null")
        return data

    @model_validator(mode="after")
    def _something(self) -> RolloutUpdate:
        if self.traffic is None and self.ramp is None:
            raise ValueError("give traffic, a ramp or both (DELETE goes back to the model's config.json)")
        return self

    @property
    def shares(self) -> dict[int, float] | None:
        return None if self.traffic is None else {int(v): s for v, s in self.traffic.items()}


class ModelServed(ModelPublic):
    # Workers registered on the model's queues (RQ's registry), all versions: 0 means its jobs wait until one starts.
    workers: int
    # Jobs waiting per lane, all versions (a bulk batch's chunk counts once); queue_length is their sum.
    queue_lengths: dict[str, int]
    # Each version (a model without versions has one, 1): the highest's input, labels and max batch are shown above.
    versions: list[VersionServed]
    # What its unpinned submits follow now.
    rollout: RolloutView


class InvalidModel(BaseModel):
    name: str
    error: str
    # Served all the same: its config turned invalid while it served, and its last good config serves until the
    # file is fixed (false: never loaded, not served).
    serving: bool = False


class ModelListing(BaseModel):
    models: list[ModelServed]
    # Folders (or versions, as model@version) in the model repository whose config.json failed its checks: not served.
    invalid: list[InvalidModel]


def invalid_models(state: AppState) -> dict[str, str]:
    """The repository's folders left out at start, with why (load_model_configs records them)."""
    return dict(state.models.invalid)


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


def _public(config: ModelConfig, versions: list[VersionServed], routing: Routing) -> ModelServed:
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
        rollout=RolloutView(
            traffic=routing.rollout.traffic if routing.rollout is not None else None,
            ramp=routing.rollout.ramp if routing.rollout is not None else None,
            set_by=routing.set_by,
            ramp_started_at=_iso(routing.ramp_since),
            unusable=routing.unusable,
        ),
    )


def _draining(config: ModelConfig, lengths: dict[str, int], workers: int) -> VersionServed:
    """A version removed from the repository while its workers still serve its queued jobs (it takes no new one)."""
    if workers:
        state, reason = "draining", "removed from the repository: its workers serve its queued jobs, then stop"
    else:
        state, reason = "unavailable", "removed from the repository with jobs still queued and no worker to serve them"
    return VersionServed(
        version=config.version, state=state, reason=reason, share=0.0, workers=workers, queue_lengths=lengths
    )


async def _served(state: AppState, models: list[str]) -> list[ModelServed]:
    """Each model with its versions' state, share, workers and queues, and the rollout its submits follow; a version
    removed from the repository is listed as draining while a worker serves it or jobs wait for it."""
    current = {m: state.versions.versions(m) for m in models}
    removed = {
        m: {c.version: c for c in state.retired.values() if c.name == m and c.version not in current[m]} for m in models
    }
    served = [c.served for m in models for c in (current[m] | removed[m]).values()]
    counts = await run_in_threadpool(state.counts, served)
    by_served, workers = counts.lengths, counts.workers
    out = []
    for model in models:
        configs = current[model]
        # A model's versions share one Redis: one that cannot be read now is listed unavailable, the rest as read.
        why = counts.unavailable.get(next(iter((configs | removed[model]).values())).served)
        if why is not None:
            out.append(_unreachable(configs or removed[model], why))
            continue
        gone = [
            _draining(c, by_served[c.served], workers[c.served])
            for c in removed[model].values()
            if workers[c.served] or sum(by_served[c.served].values())
        ]
        if not configs:
            if gone:  # the whole model was removed: listed while it drains, with no rollout (it takes no submit)
                out.append(_public(removed[model][max(removed[model])], gone, NO_ROUTING))
            continue
        routing = await read_routing(state.for_model_name(model).aredis, model, configs)
        ready = {v for v, c in configs.items() if workers[c.served]}
        shares = routing.shares(configs, ready) if ready else {}
        total = sum(shares.values()) or 1.0
        versions = [
            _version(
                c,
                by_served[c.served],
                workers[c.served],
                routing.told[v],
                shares.get(v, 0.0) / total,
                routing.rolled_back.get(v),
            )
            for v, c in configs.items()
        ]
        versions = sorted(versions + gone, key=lambda v: v.version)
        out.append(_public(configs[max(configs)], versions, routing))
    return out


def _unreachable(configs: dict[int, ModelConfig], why: str) -> ModelServed:
    """A model whose Redis cannot be read now: each version unavailable, saying why (its config's rollout shown)."""
    empty = dict.fromkeys(keys.LANES, 0)
    versions = [
        VersionServed(version=v, state="unavailable", reason=why, share=0.0, workers=0, queue_lengths=empty)
        for v in sorted(configs)
    ]
    configured = configs[max(configs)]
    return _public(configured, versions, Routing(configured.rollout, "config", {}, {}, None))


@router.get("", response_model=ModelListing)
async def list_models(state: State) -> ModelListing:
    """Every model this deployment serves, with its versions, queue lengths and live workers; and the configs left
    out."""
    return ModelListing(
        models=await _served(state, sorted(set(state.models.models()) | {c.name for c in state.retired.values()})),
        invalid=[
            InvalidModel(name=n, error=e, serving=n in state.models) for n, e in sorted(invalid_models(state).items())
        ],
    )


class Reloaded(BaseModel):
    # Served names (model, or model@version past 1) the repository gained, lost or changed, and those now invalid.
    added: list[str]
    removed: list[str]
    changed: list[str]
    invalid: list[str]


@router.post("/reload", response_model=Reloaded, responses=OPERATOR_ERRORS, dependencies=OPERATOR_ONLY)
async def reload_models(state: State) -> Reloaded:
    """Read the model repository again now, as the API also does by itself when it changes (INFERQ_MODELS_POLL_S):
    new models and versions are served, removed ones refused, without a restart. Workers are started apart
    (`inferq up` does it; elsewhere, start `inferq worker --model NAME` for each new one)."""
    changes = await state.reread()
    log.info("model repository read again by request: %s", described(changes))
    return Reloaded(**changes)


@router.get("/{model}", response_model=ModelServed, responses=ERRORS)
async def get_model(config: Model, state: State) -> ModelServed:
    """One model: its inputs, labels, max batch, versions, queue length and live workers."""
    (served,) = await _served(state, [config.name])
    return served


@router.post(
    "/{model}/versions/{version}/restore",
    response_model=ModelServed,
    responses=OPERATOR_ERRORS,
    dependencies=OPERATOR_ONLY,
)
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


# FastAPI answers 400 to a body that is not even JSON (422: JSON the model refuses).
BODY_ERRORS = {**OPERATOR_ERRORS, 400: ERRORS[422]}


@router.put("/{model}/rollout", response_model=ModelServed, responses=BODY_ERRORS, dependencies=OPERATOR_ONLY)
async def set_model_rollout(config: Model, update: RolloutUpdate, state: State) -> ModelServed:
    """Set how the model's unpinned submits are shared between its versions, over its config.json's rollout, for
    every API process at once (a rollout event on the events channel; each reads it within a second anyway). It
    stands until DELETE, and a month after the last API process read it."""
    client = state.for_model(config).aredis
    await set_rollout(client, config.name, update.shares, update.ramp)
    await _told(state, config, update.model_dump(mode="json"))
    log.info("model %s: rollout set by request: %s", config.name, update.model_dump_json(exclude_none=True))
    (served,) = await _served(state, [config.name])
    return served


@router.delete("/{model}/rollout", response_model=ModelServed, responses=OPERATOR_ERRORS, dependencies=OPERATOR_ONLY)
async def clear_model_rollout(config: Model, state: State) -> ModelServed:
    """Go back to the rollout of the model's config.json."""
    if not await clear_rollout(state.for_model(config).aredis, config.name):
        raise NotFound(f"model {config.name} has no rollout set through the API: its config.json's holds")
    await _told(state, config, {"traffic": None, "ramp": None})
    log.info("model %s: rollout set through the API cleared by request: its config.json's holds", config.name)
    (served,) = await _served(state, [config.name])
    return served


async def _told(state: AppState, config: ModelConfig, rollout: dict[str, object]) -> None:
    """Every API process reads the model's routing afresh now: this one at once, the others on the event."""
    state.versions.forget(config.name)
    event = {"id": "", "kind": "rollout", "model": config.name, **rollout}
    await state.for_model(config).aredis.publish(keys.EVENTS_CHANNEL, json.dumps(event))
