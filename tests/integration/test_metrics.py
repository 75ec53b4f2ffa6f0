"""The cluster's metrics in Redis: every way a job ends is counted once, where the end is written."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import redis as redis_py
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferq.api.app import create_app
from inferq.api.routers import status as status_router
from inferq.shared import keys, metrics
from inferq.shared.jobs import QueueCache, cancel_job, get_job_view, new_job_id
from inferq.shared.lifecycle import bulk, census, claims, layout
from inferq.shared.lifecycle.bulk import BulkItem, NewBatch
from inferq.shared.rqjson import JSONJob
from inferq.shared.settings import Settings
from inferq.workers import batching
from inferq.workers.batching import BatchWorker
from inferq.workers.running import ModelRunner, run_batch
from tests.support.builders import write_config
from tests.support.echo import POISON, echo_runner, submit_echo

AGREED = {
    "inferq_queue_depth": ("gauge", {"model", "version", "lane"}),
    "inferq_queue_oldest_age_seconds": ("gauge", {"model", "version", "lane"}),
    "inferq_jobs_ended": ("counter", {"model", "version", "tenant", "status"}),
    "inferq_job_failures": ("counter", {"model", "version", "tenant", "reason"}),
    "inferq_job_queued_seconds": ("histogram", {"model", "version", "tenant"}),
    "inferq_job_inference_seconds": ("histogram", {"model", "version", "tenant"}),
    "inferq_job_end_to_end_seconds": ("histogram", {"model", "version", "tenant"}),
    "inferq_batch_size": ("histogram", {"model", "version"}),
    "inferq_batch_tokens": ("counter", {"model", "version"}),
    "inferq_batch_padded_tokens": ("counter", {"model", "version"}),
    "inferq_workers": ("gauge", {"model", "version", "state"}),
    "inferq_version_rolled_back": ("gauge", {"model", "version"}),
    "inferq_webhook_deliveries": ("counter", {"outcome"}),
    "inferq_webhook_delivery_seconds": ("histogram", set()),
    "inferq_http_requests": ("counter", {"route", "method", "status"}),
    "inferq_http_request_seconds": ("histogram", {"route", "method"}),
}


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url)


def _totals(redis: redis_py.Redis, model: str = "echo") -> dict[str, float]:
    return census.read_cluster(redis, [model]).models[model].totals


def test_every_way_a_job_ends_is_counted_once_where_it_is_written(redis: redis_py.Redis, settings: Settings) -> None:
    finished = [submit_echo(redis, settings, [i, i]) for i in range(3)]
    poisoned = submit_echo(redis, settings, [POISON, POISON])
    canceled = submit_echo(redis, settings, [1, 1])
    cancel_job(QueueCache(redis), settings, canceled)
    expired = submit_echo(redis, settings, [2, 2])
    redis.delete(JSONJob.key_for(expired))  # RQ's queue TTL ended its hash at its deadline
    redis.hset(keys.info_key(expired), "deadline", f"{time.time() - 1:.3f}")
    died = submit_echo(redis, settings, [3, 3])
    redis.hset(JSONJob.key_for(died), "status", "failed")  # as RQ's maintenance leaves a dead worker's job
    assert claims.announce_failed(redis, settings, [died]) == [died]
    assert claims.announce_failed(redis, settings, [died]) == []  # told once, counted once

    BatchWorker({"echo": echo_runner(16)}, connection=redis, settings=settings, name="counted").work(burst=True)

    totals = _totals(redis)
    assert metrics.counters(totals, metrics.ENDED) == {"finished": 3, "failed": 2, "canceled": 1, "expired": 1}
    assert metrics.counters(totals, metrics.FAILED) == {"ModelError": 1, "WorkerDied": 1, "Expired": 1}
    ran = [get_job_view(redis, i) for i in [*finished, poisoned]]
    assert [v["status"] for v in ran] == ["finished"] * 3 + ["failed"]
    for name, _, buckets, _ in metrics.JOB_HISTOGRAMS:  # the jobs a worker ran
        assert metrics.histogram(totals, name, buckets).count == 4, name
    batch = metrics.histogram(totals, "batch", metrics.BATCH_BUCKETS)
    assert (batch.count, batch.sum) == (1, 4)
    assert {v["batch_size"] for v in ran} == {4}
    failures = census.read_recent(redis, ["echo"], 2)["echo"].failures
    # Newest first: the batch ended after its start found the expired job, both after the announce.
    assert [f["reason"] for f in failures] == ["ModelError", "Expired", "WorkerDied"]
    assert failures[0]["error"] == get_job_view(redis, poisoned)["error"]
    assert "poison value" in failures[0]["error"]
    for key in redis.keys(f"{keys.PREFIX}:metrics:*"):
        assert redis.ttl(key) > 0, key


def test_jobs_that_do_not_end_in_their_batch_add_nothing_to_its_metrics(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finish adds a batch's metrics ready-summed, and recounts them when some job did not end there."""
    ids = [submit_echo(redis, settings, [i, i]) for i in range(4)]
    ids.append(submit_echo(redis, settings, [POISON, POISON]))
    worker = BatchWorker({"echo": echo_runner(8)}, connection=redis, settings=settings, name="recount")

    def run_then_lose_two(runner: ModelRunner, items: list[Any]) -> Any:
        report = run_batch(runner, items)
        cancel_job(QueueCache(redis), settings, ids[0])  # canceled while its batch ran: the cancel counts it
        redis.delete(JSONJob.key_for(ids[1]))  # lost mid-batch (a restart without persistence)
        return report

    monkeypatch.setattr(batching, "run_batch", run_then_lose_two)
    worker.work(burst=True)
    totals = _totals(redis)
    assert metrics.counters(totals, metrics.ENDED) == {"finished": 2, "failed": 1, "canceled": 1}
    assert metrics.counters(totals, metrics.FAILED) == {"ModelError": 1}
    for name, _, buckets, _ in metrics.JOB_HISTOGRAMS:  # the three that ended in the batch
        assert metrics.histogram(totals, name, buckets).count == 3, name
    batch = metrics.histogram(totals, "batch", metrics.BATCH_BUCKETS)
    assert (batch.count, batch.sum) == (1, 5)


def test_a_canceled_bulk_batch_counts_each_item(redis: redis_py.Redis, settings: Settings) -> None:
    items = [BulkItem(f"c{i}", json.dumps({"inputs": [i, i]}).encode(), "application/json") for i in range(6)]
    batch = NewBatch(new_job_id(), "echo", keys.BULK, 4, 600, items=items)
    bulk.enqueue_batch(redis, settings, batch)
    assert bulk.cancel_batch(redis, settings, batch.id) == "ok"
    assert metrics.counters(_totals(redis), metrics.ENDED) == {"canceled": 6}


def test_a_bulk_chunk_counts_its_items_and_its_batch_once(redis: redis_py.Redis, settings: Settings) -> None:
    values = [[i, i] for i in range(5)] + [[POISON, POISON]]
    items = [BulkItem(f"c{i}", json.dumps({"inputs": v}).encode(), "application/json") for i, v in enumerate(values)]
    bulk.enqueue_batch(redis, settings, NewBatch(new_job_id(), "echo", keys.BULK, 8, 600, items=items))
    BatchWorker({"echo": echo_runner(8)}, connection=redis, settings=settings, name="chunks").work(burst=True)
    totals = _totals(redis)
    assert metrics.counters(totals, metrics.ENDED) == {"finished": 5, "failed": 1}
    assert metrics.counters(totals, metrics.FAILED) == {"ModelError": 1}
    assert metrics.histogram(totals, "inference", metrics.TIME_BUCKETS_S).count == 6
    batch = metrics.histogram(totals, "batch", metrics.BATCH_BUCKETS)
    assert (batch.count, batch.sum) == (1, 6)


def test_throughput_counts_the_items_a_worker_ran_not_those_canceled_or_expired(
    redis: redis_py.Redis, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A canceled 20,000-line batch read as 315 jobs/s on the status page while the model ran 150/s."""
    for _ in range(3):
        submit_echo(redis, settings, [1, 1])
    submit_echo(redis, settings, [POISON, POISON])
    expired = submit_echo(redis, settings, [2, 2])
    redis.delete(JSONJob.key_for(expired))  # RQ's queue TTL ended its hash at its deadline
    redis.hset(keys.info_key(expired), "deadline", f"{time.time() - 1:.3f}")
    BatchWorker({"echo": echo_runner(16)}, connection=redis, settings=settings, name="rate").work(burst=True)
    items = [BulkItem(f"c{i}", json.dumps({"inputs": [i, i]}).encode(), "application/json") for i in range(6)]
    canceled = NewBatch(new_job_id(), "echo", keys.BULK, 4, 600, items=items)
    bulk.enqueue_batch(redis, settings, canceled)
    assert bulk.cancel_batch(redis, settings, canceled.id) == "ok"
    assert metrics.counters(_totals(redis), metrics.ENDED) == {"finished": 3, "failed": 1, "canceled": 6, "expired": 1}

    write_config(
        tmp_path / "echo", handler="tests.support.echo:SlowEcho", weights="none", input={"kind": "tensor", "shape": [2]}
    )
    # Read one window later, so that the windows just written are complete ones, which the page shows.
    later = time.time() + metrics.WINDOW_S
    monkeypatch.setattr(status_router, "time", SimpleNamespace(time=lambda: later))

    async def read_status() -> dict[str, Any]:
        app = create_app(settings.model_copy(update={"models_dir": tmp_path}))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://inferq") as client:
                response = await client.get("/v1/status")
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    (model,) = asyncio.run(read_status())["models"]
    span_s = status_router.RATE_WINDOWS * metrics.WINDOW_S
    assert model["throughput_per_s"] * span_s == pytest.approx(4)  # 3 finished, 1 failed by the model
    assert sum(p["throughput_per_s"] for p in model["series"]) * metrics.WINDOW_S == pytest.approx(4)
    assert sum(p["ended"] for p in model["series"]) == 11


def test_queue_depth_oldest_age_and_workers_are_read_from_rqs_layout(redis: redis_py.Redis, settings: Settings) -> None:
    submit_echo(redis, settings, [1, 1])
    submit_echo(redis, settings, [2, 2])
    stamp = "2020-01-01T00:00:00.000000Z"
    head = redis.lindex(layout.queue_keys(keys.queue_name("echo")).queue, 0)
    redis.hset(JSONJob.key_for(head.decode()), "enqueued_at", stamp)
    busy = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="w-busy")
    busy.register_birth()
    busy.set_state("busy")
    idle = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="w-idle")
    idle.register_birth()
    gone = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="w-gone")
    gone.register_birth()
    redis.delete(gone.key)  # its hash expired; RQ still lists it until someone prunes

    state = census.read_cluster(redis, ["echo", "other"]).models
    assert state["echo"].depth == {"interactive": 2, "bulk": 0}
    assert state["echo"].oldest_age_s["interactive"] > (time.time() - 1577836800) - 5
    assert state["echo"].oldest_age_s["bulk"] == 0
    assert state["echo"].workers == {"busy": 1, "idle": 1}
    assert state["other"].workers == {"busy": 0, "idle": 0} and state["other"].depth == {"interactive": 0, "bulk": 0}


def _scrape(cluster: metrics.Cluster) -> dict[str, object]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.ClusterCollector(lambda: cluster))
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_the_exposition_has_every_agreed_metric_with_its_type_and_labels() -> None:
    totals: metrics.Increments = {}
    metrics.job_increments(totals, "failed", 0.2, 0.03, 0.25, reason="ModelError")
    metrics.job_increments(totals, "finished", 0.02, 0.03, 0.05, tenant="acme")  # a tenant's job: its own series
    metrics.job_increments(totals, "finished", 0.02, 0.03, 0.05, tenant="acme")
    totals |= metrics.batch_increments(3, tokens=40, padded_tokens=3 * 20)  # lengths 20, 12, 8: padded to 20
    http = metrics.RequestCounts()
    http.add("/v1/jobs/{job_id}", "GET", 200, 0.004)
    http.add("/v1/jobs/{job_id}", "BREW", 405, 0.001)
    hooks: metrics.Increments = {}
    metrics.count(hooks, "outcome", "delivered")
    metrics.observe(hooks, metrics.WEBHOOK_HISTOGRAM, 0.05, metrics.TIME_BUCKETS_S)
    model = metrics.ModelState(totals=totals, depth={"interactive": 2, "bulk": 1}, oldest_age_s={"interactive": 1.5})
    families = _scrape(metrics.Cluster({"digits": model}, metrics.decode(hooks), http.drain()))
    for name, (kind, labels) in AGREED.items():
        family = families[name]
        assert family.type == kind, name  # type: ignore[attr-defined]
        for sample in family.samples:  # type: ignore[attr-defined]
            assert set(sample.labels) - {"le"} == labels, (name, sample)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}  # type: ignore[attr-defined]
    v1, anyone, acme = ("version", "1"), ("tenant", "default"), ("tenant", "acme")
    assert samples[("inferq_job_failures_total", (("model", "digits"), ("reason", "ModelError"), anyone, v1))] == 1
    assert samples[("inferq_jobs_ended_total", (("model", "digits"), ("status", "canceled"), anyone, v1))] == 0
    assert samples[("inferq_jobs_ended_total", (("model", "digits"), ("status", "finished"), acme, v1))] == 2
    assert samples[("inferq_jobs_ended_total", (("model", "digits"), ("status", "finished"), anyone, v1))] == 0
    assert samples[("inferq_batch_size_sum", (("model", "digits"), v1))] == 3
    assert samples[("inferq_batch_tokens_total", (("model", "digits"), v1))] == 40
    assert samples[("inferq_batch_padded_tokens_total", (("model", "digits"), v1))] == 60
    assert samples[("inferq_job_queued_seconds_bucket", (("le", "0.1"), ("model", "digits"), anyone, v1))] == 0
    assert samples[("inferq_job_queued_seconds_bucket", (("le", "0.25"), ("model", "digits"), anyone, v1))] == 1
    assert samples[("inferq_job_queued_seconds_bucket", (("le", "0.025"), ("model", "digits"), acme, v1))] == 2
    assert samples[("inferq_queue_oldest_age_seconds", (("lane", "bulk"), ("model", "digits"), v1))] == 0
    route = ("route", "/v1/jobs/{job_id}")
    assert samples[("inferq_http_requests_total", (("method", "OTHER"), route, ("status", "405")))] == 1
    assert samples[("inferq_http_request_seconds_count", (("method", "GET"), route))] == 1
    assert samples[("inferq_webhook_deliveries_total", (("outcome", "gave_up"),))] == 0


def test_quantiles_interpolate_within_buckets_as_prometheus_does() -> None:
    acc: metrics.Increments = {}
    for value in (0.02, 0.02, 0.04, 0.2):  # buckets (0.01, 0.025], (0.025, 0.05], (0.1, 0.25]
        metrics.observe(acc, "queued", value, metrics.TIME_BUCKETS_S)
    hist = metrics.histogram(acc, "queued", metrics.TIME_BUCKETS_S)
    assert hist.count == 4 and math.isclose(hist.sum, 0.28)
    assert math.isclose(hist.quantile(0.5) or 0, 0.025)  # rank 2 closes the (0.01, 0.025] bucket
    assert math.isclose(hist.quantile(0.75) or 0, 0.05)
    assert math.isclose(hist.quantile(0.95) or 0, 0.1 + 0.15 * 0.8)
    assert metrics.histogram({}, "queued", metrics.TIME_BUCKETS_S).quantile(0.5) is None
    metrics.observe(acc, "queued", 1000.0, metrics.TIME_BUCKETS_S)  # past the last bound
    assert metrics.histogram(acc, "queued", metrics.TIME_BUCKETS_S).quantile(0.99) == 300.0


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("model failed on this input: RuntimeError: poison value in the batch", "ModelError"),
        ("the batch ran past the job timeout of 5 s (INFERQ_JOB_TIMEOUT_S)", "Timeout"),
        ("the job's input expired before it ran", "Expired"),
        ("could not batch this input: ValueError: ragged", "InvalidInput"),
        ("the model ran out of memory on this input alone: CUDA OOM", "OutOfMemory"),
        ("cannot identify image file", "InvalidInput"),
    ],
)
def test_failure_reasons_are_counted_by_a_bounded_class(error: str, reason: str) -> None:
    assert metrics.failure_class(error) == reason


def test_webhook_attempts_count_by_outcome_with_refusals_as_gave_up(redis: redis_py.Redis, settings: Settings) -> None:
    from inferq.workers import webhooks

    for outcome in ("delivered", "retrying", "retrying", "gave up", "refused"):
        webhooks._record(redis, settings, "job-1", {"attempt": 1, "outcome": outcome}, 0.02)
    cluster = census.read_cluster(redis, [])
    assert metrics.counters(cluster.webhooks, "outcome") == {"delivered": 1, "retrying": 2, "gave_up": 2}
    hist = metrics.histogram(cluster.webhooks, metrics.WEBHOOK_HISTOGRAM, metrics.TIME_BUCKETS_S)
    assert hist.count == 5 and math.isclose(hist.sum, 0.1)
    assert redis.llen(keys.webhook_attempts_key("job-1")) == 5
    assert 0 < redis.ttl(keys.WEBHOOK_METRICS_KEY) <= metrics.TOTALS_TTL_S
