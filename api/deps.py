"""FastAPI dependencies: the process's Redis, queues, settings, models and event hub."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError

from inferq.api.auth import Owner
from inferq.api.events import EventHub
from inferq.api.versions import VersionRouter
from inferq.shared import connections, keys, shards
from inferq.shared.errors import NotFound
from inferq.shared.jobs import QueueCache
from inferq.shared.keys import served_label, split_served
from inferq.shared.lifecycle import census, layout
from inferq.shared.models import (
    ModelConfig,
    ModelRepository,
    keep_last_good,
    load_model_configs,
    repository_signature,
)
from inferq.shared.settings import Settings
from inferq.shared.tenants import Tenants
from inferq.shared.versions import clear_rollout, read_rollout

log = logging.getLogger(__name__)


@dataclass
class Shard:
    """One Redis deployment's clients (INFERQ_REDIS_URL is the shard ``default``; INFERQ_REDIS_SHARDS names more).

    The API's one rule for Redis: a route awaits ``aredis`` (auto-pipelined: concurrent requests share round trips,
    and no thread waits on a socket) for everything a client's request does to a job or a batch: submit, read, wait,
    events, cancel, a batch's view and its results. ``redis`` (with ``queues`` over it) is only ever used inside one
    ``run_in_threadpool`` call that runs a whole piece of work on it: a bulk upload's writer and a batch's cancel
    (long runs of dependent round trips between CPU work on the lines, shared with the CLI and tests), and the
    operator's reads (the status page, /metrics, model status, readiness: ``census``, shared with the workers and
    ``inferq status``). tests/unit/test_layout.py holds routes to it.
    """

    name: str
    redis: Redis
    queues: QueueCache
    events: EventHub
    aredis: AsyncRedis


@dataclass
class Counts:
    """Served names' queue lengths per lane and live workers, as their Redis deployments answered (``AppState.counts``);
    ``unavailable``: the names whose Redis could not be read, with why."""

    lengths: dict[str, dict[str, int]]
    workers: dict[str, int]
    unavailable: dict[str, str]


@dataclass
class AppState:
    """Everything a request needs, built once in the app's lifespan."""

    settings: Settings
    models: ModelRepository  # by served name: each version of each model
    shards: dict[str, Shard]
    tenants: Tenants = field(default_factory=lambda: Tenants([]))  # whose keys a request may carry
    versions: VersionRouter = field(init=False)
    # What the repository looked like when last read (repository_signature), and when it was last looked at.
    signature: tuple[tuple[str, int, int], ...] = ()
    looked_at: float = 0.0
    # Served names removed from the repository whose workers may still drain their queues: listed as ``draining``
    # (GET /v1/models, the status page, /metrics) until no worker is registered on them and nothing waits.
    retired: dict[str, ModelConfig] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.versions = VersionRouter(self.models, self.settings.worker_ttl_s)

    async def look_again(self, at_most_every_s: float = 0.0) -> bool:
        """Read the repository again if it changed since the last look (a few stat calls in the threadpool; no more
        often than ``at_most_every_s``): True if it did. The API looks every INFERQ_MODELS_POLL_S, and at once when a
        submit names a model or version it does not know, so one added a moment ago is not refused."""
        now = time.monotonic()
        if now - self.looked_at < at_most_every_s:
            return False
        self.looked_at = now
        signature = await run_in_threadpool(repository_signature, self.settings.models_dir)
        if signature == self.signature:
            return False
        self.signature = signature
        self.looked_at = 0.0  # a change found: the next miss may find another at once (a miss alone waits)
        changes = await self.reread()
        log.info("model repository changed: %s", described(changes))
        return True

    async def reread(self) -> dict[str, list[str]]:
        """``reload``, then clear each rollout set through the API that names a version the repository lost: it was
        set for versions that are gone, and would stay in force over the config's for a month of reads (a version
        named before it ever existed keeps its share waiting)."""
        before = dict(self.models)
        changes = await run_in_threadpool(self.reload)
        removed: dict[str, set[int]] = {}
        for served in changes["removed"]:
            model, version = split_served(served)
            removed.setdefault(model, set()).add(version)
        for model, versions in sorted(removed.items()):
            shard = self.for_model(next(c for c in before.values() if c.name == model))
            try:
                await _clear_rollout_naming(shard, model, versions)
            except RedisError as exc:
                log.warning("model %s: could not read or clear its rollout set through the API (%s)", model, exc)
        return changes

    def reload(self) -> dict[str, list[str]]:
        """Read the model repository again (no restart): the served names added, removed and changed, and the ones
        now invalid. Requests read ``models`` and ``versions`` afresh each time, so the next one sees the new set. A
        served version whose config turned invalid serves on as it was (``keep_last_good``), said in the log and
        under ``invalid``. (Runs in a worker thread: it reads files.)"""
        old = self.models
        fresh, kept = keep_last_good(load_model_configs(self.settings.models_dir, self.settings.redis_shards), old)
        for name in kept:
            if old.invalid.get(name) != fresh.invalid[name]:
                log.warning(
                    "model %s: its config is invalid now (%s); the config it had before serves until it is fixed",
                    served_label(name),
                    fresh.invalid[name],
                )
        changes = {
            "added": sorted(set(fresh) - set(old)),
            "removed": sorted(set(old) - set(fresh)),
            "changed": sorted(n for n in set(fresh) & set(old) if fresh[n] != old[n]),
            "invalid": sorted(fresh.invalid),
        }
        if changes["added"] or changes["removed"] or changes["changed"] or fresh.invalid != old.invalid:
            self.retired |= {name: old[name] for name in changes["removed"]}
            for name in fresh:
                self.retired.pop(name, None)
            self.models, self.versions = fresh, VersionRouter(fresh, self.settings.worker_ttl_s)
        return changes

    def config_of(self, name: str) -> ModelConfig:
        """A served name's config, served or draining."""
        return self.models[name] if name in self.models else self.retired[name]

    def forget_drained(self) -> list[str]:
        """Stop listing removed names that no worker serves any more and whose queues are empty: those forgotten
        (one on a Redis that cannot be read now stays listed). (Runs in a worker thread: it reads Redis on the sync
        clients.)"""
        names = sorted(self.retired)
        if not names:
            return []
        counts = self.counts(names)
        done = [n for n in counts.workers if not counts.workers[n] and not sum(counts.lengths[n].values())]
        for name in done:
            self.retired.pop(name, None)
        return done

    def counts(self, names: list[str]) -> Counts:
        """Each served name's queue length per lane and live workers, read from the Redis that carries it (three
        round trips per Redis, whatever the number of names); the names on a Redis other than the default one that
        cannot be read now are ``unavailable`` instead (the default one's failure is the route's own: 503)."""
        counts = Counts({}, {}, {})
        for shard, mine in self.placed(names):
            try:
                lengths, workers = self._lengths_on(shard, mine), self._live_on(shard, mine)
            except RedisError as exc:
                if shard.name == shards.DEFAULT or not connections.is_unavailable(exc):
                    raise
                why = f"its Redis ({shard.name!r}) is unavailable: {connections.why_unavailable(exc)}"
                counts.unavailable |= dict.fromkeys(mine, why)
                continue
            counts.lengths |= lengths
            counts.workers |= workers
        return counts

    def _lengths_on(self, shard: Shard, names: list[str]) -> dict[str, dict[str, int]]:
        with shard.redis.pipeline(transaction=False) as pipe:
            for name in names:
                for lane in keys.LANES:
                    queue_name = keys.queue_name(name, lane)
                    pipe.llen(shard.queues.get(queue_name).key)
                    pipe.zcard(keys.fair_backlog_key(queue_name))  # past the list, in fair order
            replies = [int(n) for n in pipe.execute()]
            flat = [a + b for a, b in zip(replies[::2], replies[1::2], strict=True)]
        lanes = len(keys.LANES)
        return {
            name: dict(zip(keys.LANES, flat[at : at + lanes], strict=True))
            for at, name in zip(range(0, len(flat), lanes), names, strict=True)
        }

    def _live_on(self, shard: Shard, names: list[str]) -> dict[str, int]:
        """How many workers RQ has registered on each name's queue that sent a heartbeat within their TTL, counted
        as routing counts them (api/versions.py ``live_workers_async``). A killed worker's hash outlives it by a
        minute and more: counted by its mere existence, a version whose draining worker was killed read as served."""
        with shard.redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.smembers(layout.workers_key(keys.queue_name(name)))
            registered = pipe.execute()
        with shard.redis.pipeline(transaction=False) as pipe:
            for workers in registered:
                for worker in workers:
                    pipe.hget(worker, census.HEARTBEAT)
            beats = iter(pipe.execute())
        within_s = self.settings.worker_ttl_s
        return {
            n: census.live_count([next(beats) for _ in ws], within_s) for n, ws in zip(names, registered, strict=True)
        }

    @property
    def home(self) -> Shard:
        """The default shard: INFERQ_REDIS_URL, which also holds the API's own request counts."""
        return self.shards[shards.DEFAULT]

    @property
    def redis(self) -> Redis:
        return self.home.redis

    def for_model(self, config: ModelConfig) -> Shard:
        """The shard that carries ``config``'s queues and jobs."""
        return self.shards[config.redis or shards.DEFAULT]

    def for_model_name(self, model: str) -> Shard:
        """The shard of a model's versions (they share one: ``load_model_configs`` holds them to it)."""
        versions = self.versions.versions(model)
        return self.for_model(next(iter(versions.values()))) if versions else self.home

    def for_id(self, job_id: str) -> Shard:
        """The shard a job or batch ID leads back to (shared/shards.py: no lookup)."""
        return self.shards[shards.of_id(job_id, self.shards)]

    def placed(self, among: Collection[str] | None = None) -> list[tuple[Shard, list[str]]]:
        """Every shard with the served models it carries (and those draining), by name, or only those ``among`` (a
        shard without any is left out)."""
        out: dict[str, list[str]] = {}
        for name, config in sorted((self.retired | dict(self.models)).items()):
            if among is None or name in among:
                out.setdefault(config.redis or shards.DEFAULT, []).append(name)
        return [(self.shards[shard], names) for shard, names in sorted(out.items())]


def described(changes: dict[str, list[str]]) -> str:
    """A reload's changes as a log line names them, each version said (``removed digits v1``)."""
    told = "; ".join(f"{kind} {', '.join(map(served_label, names))}" for kind, names in changes.items() if names)
    return told or "nothing new"


async def _clear_rollout_naming(shard: Shard, model: str, gone: set[int]) -> None:
    """Clear ``model``'s rollout set through the API if it names a version of ``gone``."""
    override = await read_rollout(shard.aredis, model)
    if override is None or override.unusable is not None:
        return
    named = set(override.traffic or {}) | ({override.ramp.version} if override.ramp is not None else set())
    if not named & gone:
        return
    await clear_rollout(shard.aredis, model)
    # Every API process reads the repository itself, and reads routing afresh after it did: no event is needed.
    versions = ", ".join(str(v) for v in sorted(named & gone))
    log.info(
        "model %s: its rollout set through the API named version %s, which left the repository: cleared, its "
        "config.json's holds",
        model,
        versions,
    )


def state_of(request: Request) -> AppState:
    """The app's state, for code that has the request (one dependency fewer to solve per request)."""
    return request.app.state.inferq


# The dependencies are ``async def``: FastAPI runs a plain ``def`` one in its threadpool, a hop per request.
async def get_state(request: Request) -> AppState:
    return state_of(request)


State = Annotated[AppState, Depends(get_state)]


def served_model(state: AppState, model: str) -> ModelConfig:
    """The model's highest version: what a route about the model as a whole shows (its versions are listed apart);
    404 for a model not served. Only for a caller whose key was checked: ``get_model`` checks it first."""
    versions = state.versions.versions(model)
    if versions:
        return versions[max(versions)]
    invalid = state.models.invalid
    if model in invalid:
        raise NotFound(f"model {model!r} is not served: its config is invalid: {invalid[model]}")
    raise NotFound(f"no model {model!r}; GET /v1/models lists them")


# The model dependencies take the caller's key (Owner) first: resolved before it, an unknown model's 404 against a
# known one's 401 told a caller without a key which models exist.
async def get_model(model: str, state: State, _owner: Owner) -> ModelConfig:
    """``served_model`` for a caller whose key is good (401 first otherwise)."""
    return served_model(state, model)


Model = Annotated[ModelConfig, Depends(get_model)]

# A submit to a model or version this process does not know has it look at the repository again, at most this often.
LOOK_ON_MISS_S = 0.5

VERSION_DOC = "the model's version to run on (default: as the model's traffic shares route it)"


async def routed_model(state: AppState, model: str, version: int | None) -> ModelConfig:
    """The config of the version a submit runs on: the one it pins (``?version=``), else as ``VersionRouter`` routes.
    Only for a caller whose key was checked: ``route_model`` checks it first."""
    try:
        served_model(state, model)  # an unknown or invalid model's 404
        return await state.versions.route(state.for_model_name(model).aredis, model, version)
    except NotFound:
        # Added a moment ago, before the next look: look now (at most a few times a second, whoever asks).
        if not state.settings.models_poll_s or not await state.look_again(at_most_every_s=LOOK_ON_MISS_S):
            raise
    served_model(state, model)
    return await state.versions.route(state.for_model_name(model).aredis, model, version)


async def pinned_version(version: Annotated[int | None, Query(ge=1, description=VERSION_DOC)] = None) -> int | None:
    """The version a submit pins (``?version=``), or None: routing chooses one. A route that takes it beside
    ``Routed`` reads the same query (FastAPI solves it once)."""
    return version


Pinned = Annotated[int | None, Depends(pinned_version)]


async def route_model(model: str, state: State, _owner: Owner, version: Pinned) -> ModelConfig:
    """``routed_model`` for a caller whose key is good (401 first otherwise)."""
    return await routed_model(state, model, version)


Routed = Annotated[ModelConfig, Depends(route_model)]
