"""The FastAPI application: ``create_app()`` with a lifespan that owns Redis and the event hub."""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from types import FrameType

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline
from redis.exceptions import RedisError
from starlette.staticfiles import StaticFiles

from inferq.api import errors
from inferq.api.auth import OPEN_PATHS
from inferq.api.autopipeline import AutoPipelinedRedis
from inferq.api.deps import AppState, Shard
from inferq.api.events import EventHub
from inferq.api.oip.routes import router as v2_router
from inferq.api.routers import batches, health, jobs, models, status, tenants
from inferq.api.routers import metrics as metrics_router
from inferq.shared import connections, tracing
from inferq.shared.errors import ConfigError
from inferq.shared.gc_tuning import tune_for_serving
from inferq.shared.jobs import QueueCache
from inferq.shared.keys import served_label
from inferq.shared.metrics import RequestCounts
from inferq.shared.models import load_model_configs, repository_signature
from inferq.shared.redis_server import die_with_parent
from inferq.shared.rqjson import refuse_pickle
from inferq.shared.settings import Settings, get_settings
from inferq.shared.tenants import Tenants

log = logging.getLogger(__name__)
# Redis connections the submit and read paths share: their commands travel in shared pipelines
# (api/autopipeline.py), so one is in use at a time; the rest are spares while one reconnects.
REDIS_POOL_SIZE = 4
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the API for ``settings`` (the environment's by default)."""
    settings = settings or get_settings()
    if not settings.redis_url:
        raise ConfigError("INFERQ_REDIS_URL is not set (`inferq up` sets it for its children)")
    model_configs = load_model_configs(settings.models_dir, settings.redis_shards)
    tracing.setup("api")  # OTEL_EXPORTER_OTLP_ENDPOINT set: each API process exports its submit spans
    # Said at every start, so a misspelt or empty INFERQ_API_KEYS cannot leave the API open unnoticed.
    open_paths = ", ".join(OPEN_PATHS)
    # Names only, never a key; and who may change what every tenant gets (api/auth.py).
    operators = ", ".join(t.name for t in settings.tenant_list if t.operator) or "none (no key may change a rollout)"
    if settings.tenants is not None and settings.tenant_list:
        names = ", ".join(t.name for t in settings.tenant_list)
        log.info(
            "API-key authentication is on: %d tenant(s) (INFERQ_TENANTS, INFERQ_API_KEYS): %s; operators: %s;"
            " open without a key: %s",
            len(settings.tenant_list),
            names,
            operators,
            open_paths,
        )
    elif settings.api_keys:
        count = len(settings.api_keys)
        plural = "" if count == 1 else "s"
        log.info(
            "API-key authentication is on: %d key%s (INFERQ_API_KEYS); operators: %s; open without one: %s",
            count,
            plural,
            operators,
            open_paths,
        )
    else:
        log.info(
            "API-key authentication is off: INFERQ_API_KEYS is not set, anyone who can reach the API may use it and"
            " act as its operator (rollouts, reloads): keep it on loopback or a private network"
        )

    request_counts = RequestCounts()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        refuse_pickle()
        shards = {name: await _open_shard(name, url, settings) for name, url in settings.redis_urls().items()}
        state = AppState(
            settings,
            model_configs,
            shards,
            tenants=Tenants(settings.tenant_list),
            signature=repository_signature(settings.models_dir),
        )
        for shard in shards.values():
            shard.events.on_routing_change = lambda model: state.versions.forget(model)  # the router of the moment
        app.state.inferq = state
        watcher = asyncio.create_task(_watch_models(state), name="inferq-models") if settings.models_poll_s else None
        flusher = metrics_router.Flusher(state.redis, request_counts)
        flusher.start()
        tune_for_serving()
        try:
            with _released_on_stop(functools.partial(_release_waits, shards.values())):
                yield
        finally:
            if watcher is not None:
                watcher.cancel()
            await flusher.stop()
            for shard in shards.values():
                await _close_shard(shard)

    # /docs and /redoc load Swagger UI and ReDoc from files fastapi-offline ships, not from a CDN: GPU hosts
    # often have no internet. No validator badge either: Swagger UI would fetch it from validator.swagger.io.
    app = FastAPIOffline(
        title="inferq",
        version="0.1.0",
        summary="Asynchronous inference queue: submit a job, get an ID, collect the result later.",
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},
        telemetry=tracing.fastapi_telemetry(),
    )
    errors.install(app)  # first: its 500s pass through every middleware added after it
    if settings.cors_origins:
        # Off unless configured: browsers then may call the API from these origins only. Every method the API has
        # (a rollout is a PUT and a DELETE), every request header it reads, and the response headers a page needs
        # to read (where a job is, how long to wait before trying again, whether its wait was applied).
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=[
                "Authorization",
                "Content-Type",
                "Content-Encoding",
                "Prefer",
                "Idempotency-Key",
                "traceparent",
                "tracestate",
            ],
            expose_headers=["Location", "Retry-After", "Preference-Applied", "WWW-Authenticate"],
        )
    # Outermost: it sees every request's final status; it counts in memory (no Redis call per request).
    app.add_middleware(metrics_router.RequestMetrics, counts=request_counts)
    app.include_router(health.router)
    app.include_router(models.router)
    # Before jobs.router: a model's own submit path, not the catch-all for unknown models, takes its jobs.
    app.include_router(jobs.router_for(settings, model_configs))
    app.include_router(jobs.router)
    app.include_router(batches.router)
    app.include_router(tenants.router)
    app.include_router(v2_router)
    app.include_router(metrics_router.router)
    app.include_router(status.router)
    app.mount("/static", StaticFiles(directory=status.STATIC_DIR), name="static")
    return app


def _release_waits(shards: Iterable[Shard]) -> None:
    for shard in shards:
        shard.events.release()


@contextmanager
def _released_on_stop(release: Callable[[], None]) -> Iterator[None]:
    """Call ``release`` on the event loop as soon as the process is asked to stop (SIGINT, SIGTERM), while the block
    runs: every request waiting on a job then answers at once (api/events.py, ``EventHub.release``).

    uvicorn stops on those signals by closing its socket and waiting for every open connection to close; the app's
    lifespan ends only after, too late for a request held open by a wait. uvicorn's handler (``Server.handle_exit``,
    in each process of ``--workers N``) is kept and called after; with none in Python, nothing waits to be told.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread can take a signal
        return
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def on_stop(signum: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(release)
        handler = previous[signal.Signals(signum)]
        if callable(handler):
            handler(signum, frame)

    chained = [sig for sig, handler in previous.items() if callable(handler)]
    for sig in chained:
        signal.signal(sig, on_stop)
    try:
        yield
    finally:
        for sig in chained:
            if signal.getsignal(sig) is on_stop:
                signal.signal(sig, previous[sig])


async def _watch_models(state: AppState) -> None:
    """Read the model repository again whenever it changes (INFERQ_MODELS_POLL_S): a new model or version is served,
    a removed one refused, with no restart. (Only the routes documented in /openapi.json stay as they were at start.)"""
    while True:
        await asyncio.sleep(state.settings.models_poll_s)
        try:
            await state.look_again()
        except Exception:  # a half-written folder or a passing I/O error: the next look tries again
            log.exception("reading the model repository again failed; serving what was read before")
        if state.retired:
            try:
                drained = await run_in_threadpool(state.forget_drained)
            except RedisError as exc:
                log.warning("could not read whether removed models still drain (%s); the next look asks again", exc)
            else:
                for name in drained:
                    log.info(
                        "model %s: removed from the repository and drained: no worker serves it", served_label(name)
                    )


async def _open_shard(name: str, url: str, settings: Settings) -> Shard:
    """A Redis deployment's clients: sync (the threadpool's paths), auto-pipelined asyncio, and its event subscriber."""
    timeout_s = settings.redis_timeout_s
    connection = connections.connect(url, timeout_s)
    pool = connections.async_pool(url, timeout_s, max_connections=REDIS_POOL_SIZE)
    aredis = AutoPipelinedRedis(connection_pool=pool, deadline_s=timeout_s, settings=settings)
    hub = EventHub(url, timeout_s)
    await hub.start()
    return Shard(name, connection, QueueCache(connection), hub, aredis)


async def _close_shard(shard: Shard) -> None:
    await shard.events.stop()
    aredis = shard.aredis
    await aredis.aclose()
    await aredis.connection_pool.aclose()
    shard.redis.close()


def create_worker_app() -> FastAPI:
    """The app of one of ``inferq api --workers N``'s processes, which ends with the process that started it.

    uvicorn's workers outlive a killed parent, still holding the port: ``inferq up`` could then not
    start again. Asked for SIGTERM at the parent's death, a worker shuts down as on any SIGTERM.
    """
    die_with_parent()
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before we asked
        raise SystemExit(0)
    return create_app()
