"""The cluster as a scrape sees it: queues, workers and the metrics hashes, read in two round trips.

Queue lengths and heads, the enqueue time of each head and the workers' registry are RQ's layout,
so they are read here, beside the scripts that write them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from redis import Redis
from redis.exceptions import RedisError
from rq.worker_registration import REDIS_WORKER_KEYS

from inferq.shared import connections, keys, metrics
from inferq.shared.lifecycle import layout


def read_cluster(connection: Redis, models: Sequence[str]) -> metrics.Cluster:
    """Every model's metrics totals, queue depth and oldest job per lane, and live workers by state."""
    lanes = keys.LANES
    with connection.pipeline(transaction=False) as pipe:
        for model in models:
            pipe.hgetall(keys.metrics_key(model))
            pipe.exists(keys.rollback_key(model))
            for lane in lanes:
                qk = layout.queue_keys(keys.queue_name(model, lane))
                pipe.llen(qk.queue)
                pipe.zcard(qk.fair_backlog)  # past the list's window, in fair order (lua/lib/fair.lua)
                pipe.lindex(qk.queue, 0)
        pipe.hgetall(keys.WEBHOOK_METRICS_KEY)
        pipe.hgetall(keys.HTTP_METRICS_KEY)
        pipe.smembers(REDIS_WORKER_KEYS)
        replies = pipe.execute()
    states: dict[str, metrics.ModelState] = {}
    heads: list[tuple[str, str, str]] = []  # (model, lane, job id)
    at = 0
    for model in models:
        state = states[model] = metrics.ModelState(
            totals=metrics.decode(replies[at]), rolled_back=bool(replies[at + 1])
        )
        at += 2
        for lane in lanes:
            depth, backlog, head = replies[at], replies[at + 1], replies[at + 2]
            at += 3
            state.depth[lane] = int(depth) + int(backlog)
            state.oldest_age_s[lane] = 0.0
            if head is not None:
                heads.append((model, lane, _text(head)))
    webhooks, http, worker_keys = metrics.decode(replies[at]), metrics.decode(replies[at + 1]), replies[at + 2]
    worker_keys = sorted(_text(k) for k in worker_keys)
    with connection.pipeline(transaction=False) as pipe:
        for _, _, job_id in heads:
            pipe.hget(layout.job_key(job_id), "enqueued_at")
        for key in worker_keys:
            pipe.hmget(key, ["queues", "state"])
        replies = pipe.execute()
    now_s = time.time()
    for (model, lane, _), enqueued in zip(heads, replies, strict=False):
        when = _epoch(enqueued)
        if when is not None:
            states[model].oldest_age_s[lane] = max(0.0, now_s - when)
    for queues, state_name in replies[len(heads) :]:
        if queues is None:
            continue  # the hash expired: a dead worker RQ has not pruned from its set yet
        busy = _text(state_name or b"") == "busy"
        served = {keys.model_from_queue(q) for q in _text(queues).split(",") if q and q != keys.WEBHOOK_QUEUE}
        for model in served:
            if model in states:
                states[model].workers["busy" if busy else "idle"] += 1
    return metrics.Cluster(states, webhooks, http)


# RQ's worker hash field: when the worker last said it lives (RQ's utcformat).
HEARTBEAT = "last_heartbeat"


def live_count(heartbeats: Sequence[bytes | str | None], within_s: float, now_s: float | None = None) -> int:
    """How many of these workers' last heartbeats (``HEARTBEAT``; None: the hash is gone) came within ``within_s``."""
    since = (time.time() if now_s is None else now_s) - within_s
    return sum(1 for beat in heartbeats if (when := _epoch(beat)) is not None and when >= since)


def read_clusters(placed: Sequence[tuple[Redis, Sequence[str]]], home: Redis) -> metrics.Cluster:
    """The cluster over every Redis deployment (shared/shards.py): each one's models, and the webhook and HTTP
    counts summed (the API's request counts live on ``home``, INFERQ_REDIS_URL's; each webhook sender counts on
    the deployment it serves)."""
    models: dict[str, metrics.ModelState] = {}
    webhooks: dict[str, float] = {}
    http: dict[str, float] = {}
    unavailable: dict[str, str] = {}
    read: dict[int, metrics.Cluster] = {}
    for connection, names in placed:
        try:
            read[id(connection)] = read_cluster(connection, names)
        except RedisError as exc:  # one deployment down: its models are said unavailable, the rest are read
            if connection is home or not connections.is_unavailable(exc):
                raise
            unavailable |= dict.fromkeys(names, f"its Redis is unavailable: {connections.why_unavailable(exc)}")
    if id(home) not in read:
        read[id(home)] = read_cluster(home, [])
    for cluster in read.values():
        models |= cluster.models
        webhooks = metrics.merge([webhooks, cluster.webhooks])
        http = metrics.merge([http, cluster.http])
    return metrics.Cluster(models, webhooks, http, unavailable)


def unfinished(connection: Redis, served: str) -> int:
    """How many of a model version's jobs (or bulk chunks) have not ended: waiting in its queues, taken into their
    intermediate lists, or in their started registries (a dead worker's, until RQ's maintenance gives them back)."""
    with connection.pipeline(transaction=False) as pipe:
        for lane in keys.LANES:
            qk = layout.queue_keys(keys.queue_name(served, lane))
            pipe.llen(qk.queue)
            pipe.llen(qk.intermediate)
            pipe.zcard(qk.started)
        return sum(int(n) for n in pipe.execute())


@dataclass(frozen=True)
class Recent:
    """A model's last windows (oldest first: start, fields) and its latest failures (newest first)."""

    windows: list[tuple[int, dict[str, float]]]
    failures: list[dict[str, Any]]


def read_recent(connection: Redis, models: Sequence[str], windows: int, at: float | None = None) -> dict[str, Recent]:
    """The status page's history: ``windows`` windows per model up to the current one, in one round trip."""
    last = metrics.window_start(at)
    starts = [last - metrics.WINDOW_S * i for i in range(windows - 1, -1, -1)]
    with connection.pipeline(transaction=False) as pipe:
        for model in models:
            for start in starts:
                pipe.hgetall(keys.metrics_window_key(model, start))
            pipe.lrange(keys.metrics_failures_key(model), 0, metrics.FAILURES_KEPT - 1)
        replies = pipe.execute()
    out, at_reply = {}, 0
    for model in models:
        rows = [(start, metrics.decode(replies[at_reply + i])) for i, start in enumerate(starts)]
        at_reply += len(starts)
        failures = []
        for raw in cast(list[bytes], replies[at_reply]):
            try:
                failures.append(json.loads(raw))
            except ValueError:
                continue
        at_reply += 1
        out[model] = Recent(rows, failures)
    return out


def _epoch(value: bytes | str | None) -> float | None:
    if not value:
        return None
    try:  # RQ's utcformat
        return datetime.fromisoformat(_text(value).rstrip("Z")).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
