"""The cluster's metrics: what workers and API processes add to Redis, and how a scrape reads it back.

Workers and API processes never keep a Prometheus registry of their own that a scrape would have to
reach: they add counts and histogram buckets to hashes in Redis (``keys.metrics_key`` and friends),
the workers inside the transaction that already ends a batch, the API processes once a second. Any API
process's ``GET /metrics`` then reads the whole cluster in two pipelined round trips and hands it to
``prometheus_client`` as a custom collector (``ClusterCollector``).

A hash's fields: ``<histogram>:b:<i>`` (observations in bucket ``i``, not cumulative; the last index is
+Inf), ``<histogram>:sum``, ``<histogram>:count``, and ``<counter>:<label>``. The same fields, per short
window (``WINDOW_S``), feed the status page's charts and quantiles.
"""

from __future__ import annotations

import bisect
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from inferq.shared import keys
from inferq.shared.tenants import DEFAULT as DEFAULT_TENANT

# Seconds; the top buckets cover long queues and slow models on a busy cluster.
TIME_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
HTTP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Histograms per model: the name in Redis, the Prometheus name, its buckets, its help.
JOB_HISTOGRAMS = (
    ("queued", "inferq_job_queued_seconds", TIME_BUCKETS_S, "Time from enqueue to the start of the job's batch."),
    ("inference", "inferq_job_inference_seconds", TIME_BUCKETS_S, "Compute time of the batch the job ran in."),
    ("e2e", "inferq_job_end_to_end_seconds", TIME_BUCKETS_S, "Time from submit to the job's end."),
)
BATCH_HISTOGRAM = ("batch", "inferq_batch_size", BATCH_BUCKETS, "Items per batch a worker ran (one per batch).")
TOKENS, PADDED_TOKENS = "tokens", "padded_tokens"  # counters: a sequence model's tokens, and its padded grid
ENDED = "ended"  # counter: jobs ended, by status
ACCEPTED = "accepted"  # counter: a tenant's jobs (and upload lines) accepted, by lane (the status page's in flight)
FAILED = "failed"  # counter: failures, by reason class
STATUSES = ("finished", "failed", "canceled", "expired")
WEBHOOK_OUTCOMES = ("delivered", "retrying", "gave_up")
WEBHOOK_HISTOGRAM = "delivery"

# The totals live a day past their last write: an idle cluster's counters reset, as Prometheus allows.
TOTALS_TTL_S = 86_400
# The status page's windows: 10 s each, 6 minutes of them kept.
WINDOW_S = 10
WINDOWS_KEPT = 36
WINDOW_TTL_S = WINDOW_S * (WINDOWS_KEPT + 1)
# Recent failures kept per model for the status page, and how much of each error.
FAILURES_KEPT = 20
FAILURE_TEXT_MAX = 300
FAILURES_TTL_S = TOTALS_TTL_S
# Methods a request is counted under; anything else is OTHER, so a client cannot grow the label set.
HTTP_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
UNMATCHED_ROUTE = "unmatched"

Increments = dict[str, float]

# Failure reasons a worker writes (workers/running.py, workers/batching.py), by the start of the readable
# error, and the class each is counted under; any other error is the input's (preprocess refused it).
_REASON_PREFIXES = (
    ("the job's input expired", "Expired"),
    ("the batch ran past the job timeout", "Timeout"),
    ("could not batch this input", "InvalidInput"),
    ("the model ran out of memory", "OutOfMemory"),
    ("model failed on this input", "ModelError"),
    ("the model's outputs could not be matched", "ModelError"),
    ("could not encode the output", "ModelError"),
)


def failure_class(error: str) -> str:
    """The bounded class a worker's readable failure reason is counted under."""
    for prefix, reason in _REASON_PREFIXES:
        if error.startswith(prefix):
            return reason
    return "InvalidInput"


# A histogram's field names, by (name, number of buckets): a worker observes three per job it ends, and
# building the names each time was most of what an observation cost.
_FIELDS: dict[tuple[str, int], tuple[tuple[str, ...], str, str]] = {}


def _fields(name: str, buckets: int) -> tuple[tuple[str, ...], str, str]:
    fields = _FIELDS.get((name, buckets))
    if fields is None:
        per_bucket = tuple(f"{name}:b:{i}" for i in range(buckets + 1))
        fields = _FIELDS[(name, buckets)] = (per_bucket, f"{name}:sum", f"{name}:count")
    return fields


def observe(acc: Increments, name: str, value: float, buckets: tuple[float, ...], weight: float = 1) -> None:
    """Add ``weight`` observations of ``value`` to histogram ``name`` in ``acc``."""
    per_bucket, total, count_ = _fields(name, len(buckets))
    bucket = per_bucket[bisect.bisect_left(buckets, value)]  # le: a value equal to a bound falls in that bucket
    add(acc, bucket, weight)
    add(acc, total, value * weight)
    add(acc, count_, weight)


def add(acc: Increments, name: str, value: float) -> None:
    acc[name] = acc.get(name, 0.0) + value


def count(acc: Increments, counter: str, label: str, value: float = 1) -> None:
    add(acc, f"{counter}:{label}", value)


def job_increments(
    acc: Increments,
    status: str,
    queued_s: float | None,
    inference_s: float,
    end_to_end_s: float | None,
    weight: float = 1,
    reason: str | None = None,
    tenant: str | None = None,
) -> None:
    """What one job a worker ran adds (``weight`` items of a bulk chunk at once), under its ``tenant``'s names when
    it has one (``tenant_prefix``)."""
    at = tenant_prefix(tenant)
    count(acc, at + ENDED, status, weight)
    if reason is not None:
        count(acc, at + FAILED, reason, weight)
    if queued_s is not None:
        observe(acc, at + "queued", max(0.0, queued_s), TIME_BUCKETS_S, weight)
    observe(acc, at + "inference", max(0.0, inference_s), TIME_BUCKETS_S, weight)
    if end_to_end_s is not None:
        observe(acc, at + "e2e", max(0.0, end_to_end_s), TIME_BUCKETS_S, weight)


# A job of a tenant (shared/tenants.py) is counted under field names prefixed by its name and TENANT_SEP, which no
# tenant name holds: ``acme|ended:finished``. A job without one (no tenants configured) keeps the plain names, and
# /metrics labels it tenant="default". Tenant names come from the configuration only: the label is bounded.
TENANT_SEP = "|"


def tenant_prefix(tenant: str | None) -> str:
    return f"{tenant}{TENANT_SEP}" if tenant and tenant != DEFAULT_TENANT else ""


def by_tenant(fields: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """A model's fields per tenant, each under its plain names (the default tenant's are the unprefixed ones)."""
    out: dict[str, dict[str, float]] = {DEFAULT_TENANT: {}}
    for name, value in fields.items():
        tenant, sep, plain = name.partition(TENANT_SEP)
        if sep:
            out.setdefault(tenant, {})[plain] = value
        else:
            out[DEFAULT_TENANT][name] = value
    return out


def fold_tenants(fields: Mapping[str, float]) -> dict[str, float]:
    """A model's fields with every tenant's added into the plain names: the model as a whole."""
    out: dict[str, float] = {}
    for name, value in fields.items():
        plain = name.partition(TENANT_SEP)[2] or name
        out[plain] = out.get(plain, 0.0) + value
    return out


def batch_increments(items: int, tokens: int = 0, padded_tokens: int = 0) -> Increments:
    """One batch: its size, and for a sequence model the tokens it held and the padded grid they ran in."""
    acc: Increments = {}
    observe(acc, BATCH_HISTOGRAM[0], float(items), BATCH_BUCKETS)
    if padded_tokens:
        add(acc, TOKENS, float(tokens))
        add(acc, PADDED_TOKENS, float(padded_tokens))
    return acc


def failure_record(reason: str, error: str, at: float | None = None, tenant: str | None = None) -> str:
    """One entry of a model's recent failures list: no job id; its ``tenant`` (the job's, when it had one), since an
    error may echo the job's input and the status page shows a tenant only its own (lua/lib/announce.lua's
    ``note_reason`` writes the same)."""
    at = time.time() if at is None else at
    record: dict[str, Any] = {"at": round(at, 3), "reason": reason, "error": error[:FAILURE_TEXT_MAX]}
    if tenant:
        record["tenant"] = tenant
    return json.dumps(record, separators=(",", ":"))


def window_start(at: float | None = None) -> int:
    at = time.time() if at is None else at
    return int(at // WINDOW_S * WINDOW_S)


def encode(acc: Increments) -> str:
    """Increments as the lifecycle scripts take them: a JSON object (floats; Lua adds them with HINCRBYFLOAT)."""
    return json.dumps(acc, separators=(",", ":"))


# -- reading ------------------------------------------------------------------------------------
def decode(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> dict[str, float]:
    out = {}
    for name, value in raw.items():
        text = name.decode() if isinstance(name, bytes) else name
        try:
            out[text] = float(value)
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class Histogram:
    """A histogram read back: cumulative counts per upper bound (the last is +Inf), sum and count."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float
    count: float

    def prometheus_buckets(self) -> list[tuple[str, float]]:
        return [(_le(bound), value) for bound, value in zip(self.bounds, self.cumulative, strict=True)]

    def quantile(self, q: float) -> float | None:
        """As Prometheus's histogram_quantile: linear within the bucket; None without observations."""
        total = self.cumulative[-1] if self.cumulative else 0.0
        if total <= 0:
            return None
        rank = q * total
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in zip(self.bounds, self.cumulative, strict=True):
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower_bound  # the highest finite bound, as Prometheus answers
                inside = cumulative - lower_count
                share = (rank - lower_count) / inside if inside > 0 else 1.0
                return lower_bound + (bound - lower_bound) * share
            lower_bound, lower_count = bound, cumulative
        return lower_bound

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None


def histogram(fields: Mapping[str, float], name: str, buckets: tuple[float, ...]) -> Histogram:
    bounds = (*buckets, math.inf)
    running, cumulative = 0.0, []
    for index in range(len(bounds)):
        running += fields.get(f"{name}:b:{index}", 0.0)
        cumulative.append(running)
    return Histogram(bounds, tuple(cumulative), fields.get(f"{name}:sum", 0.0), fields.get(f"{name}:count", 0.0))


def counters(fields: Mapping[str, float], counter: str) -> dict[str, float]:
    prefix = f"{counter}:"
    return {name.removeprefix(prefix): value for name, value in fields.items() if name.startswith(prefix)}


def items_run(fields: Mapping[str, float]) -> float:
    """The items a worker ran, finished or failed in their batch: what throughput counts.

    Not the jobs ended: canceled and expired items end without running, and a canceled 20,000-line batch
    read as twice the model's rate. A worker observes each item it ran once in the inference histogram.
    """
    return fields.get(_fields("inference", len(TIME_BUCKETS_S))[2], 0.0)


def merge(windows: Iterable[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for window in windows:
        for name, value in window.items():
            out[name] = out.get(name, 0.0) + value
    return out


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


# -- API requests -------------------------------------------------------------------------------
class RequestCounts:
    """An API process's requests since its last flush, in memory: the middleware adds, a task flushes.

    Both run on the event loop's thread, so a plain dict needs no lock.
    """

    def __init__(self) -> None:
        self._acc: Increments = {}

    def add(self, route: str, method: str, status: int, seconds: float) -> None:
        method = method if method in HTTP_METHODS else "OTHER"
        acc = self._acc
        name = f"c|{route}|{method}|{status}"
        acc[name] = acc.get(name, 0.0) + 1
        observe(acc, f"h|{route}|{method}", seconds, HTTP_BUCKETS_S)

    def drain(self) -> Increments:
        acc, self._acc = self._acc, {}
        return acc


# -- the scrape ---------------------------------------------------------------------------------
@dataclass
class ModelState:
    """One model as a scrape reads it from Redis."""

    totals: dict[str, float] = field(default_factory=dict)
    depth: dict[str, int] = field(default_factory=dict)  # per lane
    oldest_age_s: dict[str, float] = field(default_factory=dict)  # per lane; 0 when empty
    workers: dict[str, int] = field(default_factory=lambda: {"busy": 0, "idle": 0})
    rolled_back: bool = False  # the system rolled this version back (shared/versions.py)


@dataclass
class Cluster:
    """The whole cluster as one scrape reads it."""

    models: dict[str, ModelState]
    webhooks: dict[str, float]
    http: dict[str, float]
    # Models (by served name) whose Redis could not be read for this scrape, with why: absent from ``models``.
    unavailable: dict[str, str] = field(default_factory=dict)


class ClusterCollector(Collector):
    """A ``prometheus_client`` collector over one ``Cluster`` read per scrape; ``tenants``: whether the per-job
    families carry the ``tenant`` label (else each model's tenants are added into one series: a scrape that may not
    name them, api/auth.py ``names_tenants``)."""

    def __init__(self, read: Callable[[], Cluster], tenants: bool = True) -> None:
        self.read = read
        self.tenants = tenants

    def collect(self) -> Iterator[Metric]:
        cluster = self.read()
        yield from _model_metrics(cluster.models, self.tenants)
        yield _unavailable_metric(cluster)
        yield from _webhook_metrics(cluster.webhooks)
        yield from _http_metrics(cluster.http)


def _unavailable_metric(cluster: Cluster) -> Metric:
    """1 for each model version whose Redis could not be read (its other series are missing from this scrape)."""
    gauge = GaugeMetricFamily(
        "inferq_model_unavailable",
        "1 while the Redis that carries the model version cannot be read (its other series are absent), else 0.",
        labels=["model", "version"],
    )
    for served, down in sorted(
        {**dict.fromkeys(cluster.models, 0.0), **dict.fromkeys(cluster.unavailable, 1.0)}.items()
    ):
        model, version = keys.split_served(served)
        gauge.add_metric([model, str(version)], down)
    return gauge


def _model_metrics(models: Mapping[str, ModelState], tenants: bool = True) -> Iterator[Metric]:
    """Every model version's families, labelled by model and version (``models`` is by served name), and the per-job
    ones by tenant when ``tenants``."""
    per_job = ["model", "version", "tenant"] if tenants else ["model", "version"]
    depth = GaugeMetricFamily(
        "inferq_queue_depth", "Jobs waiting in the model's queue, per lane.", labels=["model", "version", "lane"]
    )
    age = GaugeMetricFamily(
        "inferq_queue_oldest_age_seconds",
        "Age of the oldest job waiting, per lane (0 when empty).",
        labels=["model", "version", "lane"],
    )
    workers = GaugeMetricFamily(
        "inferq_workers", "Live workers serving the model, by state.", labels=["model", "version", "state"]
    )
    ended = CounterMetricFamily("inferq_jobs_ended", "Jobs ended, by status.", labels=[*per_job, "status"])
    failures = CounterMetricFamily(
        "inferq_job_failures", "Failed or expired jobs, by reason class.", labels=[*per_job, "reason"]
    )
    rolled_back = GaugeMetricFamily(
        "inferq_version_rolled_back",
        "1 while the system has rolled the version back (its jobs failed too often, or its warm-up failed).",
        labels=["model", "version"],
    )
    histograms = {
        name: HistogramMetricFamily(metric, help_text, labels=per_job) for name, metric, _, help_text in JOB_HISTOGRAMS
    }
    batch_name, batch_metric, batch_buckets, batch_help = BATCH_HISTOGRAM
    batches = HistogramMetricFamily(batch_metric, batch_help, labels=["model", "version"])
    tokens = CounterMetricFamily(
        "inferq_batch_tokens", "Tokens of input a sequence model's batches held.", labels=["model", "version"]
    )
    padded = CounterMetricFamily(
        "inferq_batch_padded_tokens",
        "Token positions a sequence model ran, padding included (1 - tokens / padded is the padding waste).",
        labels=["model", "version"],
    )
    for served, state in sorted(models.items()):
        model, number = keys.split_served(served)
        version = str(number)
        for lane, waiting in state.depth.items():
            depth.add_metric([model, version, lane], waiting)
            age.add_metric([model, version, lane], state.oldest_age_s.get(lane, 0.0))
        for worker_state, live in state.workers.items():
            workers.add_metric([model, version, worker_state], live)
        rolled_back.add_metric([model, version], 1.0 if state.rolled_back else 0.0)
        by_series = by_tenant(state.totals) if tenants else {"": fold_tenants(state.totals)}
        for tenant, fields in sorted(by_series.items()):
            labels = [model, version, tenant] if tenants else [model, version]
            by_status = counters(fields, ENDED)
            for status in STATUSES:
                ended.add_metric([*labels, status], by_status.get(status, 0.0))
            for reason, value in sorted(counters(fields, FAILED).items()):
                failures.add_metric([*labels, reason], value)
            for name, _, buckets, _ in JOB_HISTOGRAMS:
                hist = histogram(fields, name, buckets)
                histograms[name].add_metric(labels, hist.prometheus_buckets(), hist.sum)
        hist = histogram(state.totals, batch_name, batch_buckets)
        batches.add_metric([model, version], hist.prometheus_buckets(), hist.sum)
        if PADDED_TOKENS in state.totals:
            tokens.add_metric([model, version], state.totals.get(TOKENS, 0.0))
            padded.add_metric([model, version], state.totals[PADDED_TOKENS])
    yield from (depth, age, workers, rolled_back, ended, failures, *histograms.values(), batches, tokens, padded)


def _webhook_metrics(fields: Mapping[str, float]) -> Iterator[Metric]:
    outcomes = CounterMetricFamily(
        "inferq_webhook_deliveries", "Webhook delivery attempts, by outcome.", labels=["outcome"]
    )
    by_outcome = counters(fields, "outcome")
    for outcome in WEBHOOK_OUTCOMES:
        outcomes.add_metric([outcome], by_outcome.get(outcome, 0.0))
    latency = HistogramMetricFamily("inferq_webhook_delivery_seconds", "Time one webhook delivery attempt took.")
    hist = histogram(fields, WEBHOOK_HISTOGRAM, TIME_BUCKETS_S)
    latency.add_metric([], hist.prometheus_buckets(), hist.sum)
    yield from (outcomes, latency)


def _http_metrics(fields: Mapping[str, float]) -> Iterator[Metric]:
    requests = CounterMetricFamily(
        "inferq_http_requests", "API requests, by route template.", labels=["route", "method", "status"]
    )
    latency = HistogramMetricFamily("inferq_http_request_seconds", "API request time.", labels=["route", "method"])
    series: set[tuple[str, str]] = set()
    for name, value in sorted(fields.items()):
        kind, *rest = name.split("|")
        if kind == "c" and len(rest) == 3:
            requests.add_metric(rest, value)
        elif kind == "h" and len(rest) == 2:
            series.add((rest[0], rest[1].split(":", 1)[0]))
    for route, method in sorted(series):
        hist = histogram(fields, f"h|{route}|{method}", HTTP_BUCKETS_S)
        latency.add_metric([route, method], hist.prometheus_buckets(), hist.sum)
    yield from (requests, latency)
