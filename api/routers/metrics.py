"""``GET /metrics``: the whole cluster in Prometheus's text format, and the API's own request counts.

The numbers live in Redis (``shared.metrics``): workers add theirs when a batch ends, every API
process flushes its request counts once a second, and a scrape of any API process reads them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis import Redis
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferq.api.auth import names_tenants
from inferq.api.deps import AppState, State
from inferq.shared import connections, durability, keys, metrics
from inferq.shared.lifecycle import census

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])
FLUSH_EVERY_S = 1.0
# What generate_latest writes (metric names need no escaping); every Prometheus parses version 0.0.4.
EXPOSITION_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RequestMetrics:
    """Pure ASGI middleware: counts each request by route template, method and status, in memory.

    No Redis call per request: ``Flusher`` adds the counts to Redis once a second. Starlette's router
    leaves the matched route in the scope, so the label is its template (``/v1/jobs/{job_id}``), never
    the raw path; a request no route matched counts as ``unmatched``.
    """

    def __init__(self, app: ASGIApp, counts: metrics.RequestCounts) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers if the app raises before it starts a response

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            template = getattr(route, "path_format", None) or getattr(route, "path", None) or metrics.UNMATCHED_ROUTE
            self.counts.add(template, scope["method"], status, time.perf_counter() - started)


class Flusher:
    """Adds this process's request counts to the cluster's hash in Redis every ``FLUSH_EVERY_S``."""

    def __init__(self, connection: Redis, counts: metrics.RequestCounts) -> None:
        self.connection = connection
        self.counts = counts
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()  # what the last second counted

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            await self.flush()

    async def flush(self) -> None:
        counted = self.counts.drain()
        if not counted:
            return
        try:
            await asyncio.to_thread(_write, self.connection, counted)
        except RedisError as exc:
            log.warning("request metrics not flushed (%s); %d series dropped", type(exc).__name__, len(counted))


def _write(connection: Redis, counted: metrics.Increments) -> None:
    with connection.pipeline(transaction=False) as pipe:
        for name, value in counted.items():
            pipe.hincrbyfloat(keys.HTTP_METRICS_KEY, name, value)
        pipe.expire(keys.HTTP_METRICS_KEY, metrics.TOTALS_TTL_S)
        pipe.execute()


class DurabilityCollector(Collector):
    """What an acknowledgement means here (INFERQ_DURABILITY) and, with ``replica``, whether it can be given now."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        settings = self.state.settings
        mode = GaugeMetricFamily(
            "inferq_durability", "What a 202 promises (INFERQ_DURABILITY): 1 for the mode set.", labels=["mode"]
        )
        for name in ("async", "replica", "fsync"):
            mode.add_metric([name], 1.0 if settings.durability == name else 0.0)
        yield mode
        if settings.durability != "replica":
            return
        replicas = GaugeMetricFamily(
            "inferq_redis_connected_replicas", "Replicas connected to the Redis primary.", labels=["redis"]
        )
        unavailable = GaugeMetricFamily(
            "inferq_durability_unavailable",
            "1 while INFERQ_DURABILITY=replica cannot acknowledge (too few replicas): submits answer 503.",
            labels=["redis"],
        )
        for name, shard in sorted(self.state.shards.items()):
            try:
                count, reason = durability.readiness(shard.redis, settings)
            except RedisError as exc:  # that Redis down: it acknowledges nothing, and the rest is still scraped
                if shard is self.state.home or not connections.is_unavailable(exc):
                    raise
                count, reason = 0, "unavailable"
            replicas.add_metric([name], float(count or 0))
            unavailable.add_metric([name], 1.0 if reason else 0.0)
        yield replicas
        yield unavailable


def exposition(state: AppState, tenants: bool = True) -> bytes:
    """One scrape: the cluster read from Redis, written by prometheus_client (``tenants``: with the tenant label)."""
    registry = CollectorRegistry(auto_describe=False)
    placed = [(shard.redis, names) for shard, names in state.placed()]
    registry.register(metrics.ClusterCollector(lambda: census.read_clusters(placed, state.redis), tenants))
    registry.register(DurabilityCollector(state))
    return generate_latest(registry)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition format 0.0.4"}},
)
async def scrape(request: Request, state: State) -> Any:
    """The whole cluster's metrics (queues, jobs, batches, workers, webhooks, API requests) for Prometheus. Open; with
    API keys its per-job families name the tenants (the `tenant` label) only to an operator's key."""
    body = await run_in_threadpool(exposition, state, names_tenants(request))
    return Response(body, media_type=EXPOSITION_TYPE)
