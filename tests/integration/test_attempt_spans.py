"""Tracing on, a job's running attempt is kept in Redis (``keys.attempt_key``) so a retry links to it: that record
lives no longer than the started job's own hash and goes with the job's end, however it ends (finished, failed,
canceled, expired, failed by maintenance), on a real Redis and a real batching worker. The webhook's span still
finds the attempt that ended the job."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis as redis_py
import torch
from opentelemetry.sdk.trace import TracerProvider

from inferq.shared import keys, tracing
from inferq.shared.jobs import QueueCache, Submission, cancel_job, enqueue_job, get_job_view
from inferq.shared.lifecycle import claims
from inferq.shared.lifecycle.info import F
from inferq.shared.settings import Settings
from inferq.workers import traces
from inferq.workers.batching import BatchWorker
from tests.support.echo import POISON, SlowEcho, echo_runner

ATTEMPTS = "inferq:attempt:*"


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tracing on in this process, its spans kept nowhere (no exporter): what the worker stores is the test."""
    provider = TracerProvider(id_generator=tracing._id_generator())
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    yield
    provider.shutdown()


def submit(redis: redis_py.Redis, settings: Settings, value: float) -> str:
    payload = json.dumps({"inputs": [value, value]}).encode()
    return enqueue_job(QueueCache(redis), settings, Submission("echo", payload, "application/json")).id


class Peeking(SlowEcho):
    """Reads, while its batch runs, each attempt record's TTL beside its job's hash's."""

    redis: redis_py.Redis
    seen: list[tuple[int, int]] = []

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        for key in Peeking.redis.scan_iter(ATTEMPTS):
            job_id = key.decode().rsplit(":", 1)[1]
            Peeking.seen.append((int(Peeking.redis.ttl(key)), int(Peeking.redis.ttl(f"rq:job:{job_id}"))))
        return super().predict(batch)


def work(redis: redis_py.Redis, settings: Settings, max_batch: int = 4) -> None:
    worker = BatchWorker({"echo": echo_runner(max_batch)}, connection=redis, settings=settings, name="traced")
    worker.work(burst=True)


@pytest.mark.usefixtures("traced")
def test_every_attempt_record_goes_with_its_jobs_end(redis: redis_py.Redis, redis_url: str) -> None:
    """Issue 45 item 27: each job left inferq:attempt:<id> for queue TTL + job timeout + 600 s (4,500 s), longer than
    its own result, never deleted when it ended."""
    settings = Settings(redis_url=redis_url)
    ok = [submit(redis, settings, float(n)) for n in range(5)]
    bad = submit(redis, settings, POISON)
    work(redis, settings)
    assert {get_job_view(redis, i)["status"] for i in ok} == {"finished"}
    assert get_job_view(redis, bad)["status"] == "failed"
    assert list(redis.scan_iter(ATTEMPTS)) == []
    # What ended each job stays with the job's own record, for its webhook's span: a child of that attempt.
    ended_in = redis.hget(keys.info_key(ok[0]), F.ENDED_IN)
    assert ended_in is not None
    traceparent = ended_in.decode().split(" ")[0]
    span = traces.webhook_span(redis, ok[0], 1)
    assert span is not None
    assert span.span.parent.span_id == int(traceparent.split("-")[2], 16)
    span.end({"outcome": "delivered"})


@pytest.mark.usefixtures("traced")
def test_a_record_left_by_a_lost_attempt_goes_when_the_job_ends_without_running(
    redis: redis_py.Redis, redis_url: str
) -> None:
    """A job run once by a worker that died is queued again with its attempt's record: canceled, expired in its
    queue, or failed by maintenance, the record goes too."""
    settings = Settings(redis_url=redis_url)
    canceled, expired, failed = (submit(redis, settings, float(n)) for n in range(3))
    for job_id in (canceled, expired, failed):
        redis.set(keys.attempt_key(job_id), "00-" + "1" * 32 + "-" + "2" * 16 + "-01 1", ex=3600)
    cancel_job(QueueCache(redis), settings, canceled)
    redis.delete(f"rq:job:{expired}")  # its queue TTL passed: its hash expired, its id still in the list
    redis.hset(f"rq:job:{failed}", "status", "failed")  # as RQ's maintenance leaves a dead worker's last try
    claims.announce_failed(redis, settings, [failed])
    work(redis, settings)
    assert list(redis.scan_iter(ATTEMPTS)) == []


@pytest.mark.usefixtures("traced")
def test_an_attempt_record_lives_as_its_running_jobs_hash(redis: redis_py.Redis, redis_url: str) -> None:
    settings = Settings(redis_url=redis_url)
    runner = echo_runner(2)
    runner.handler = Peeking(runner.config, runner.device)
    runner.handler.load()
    Peeking.redis, Peeking.seen = redis, []
    submit(redis, settings, 1.0)
    BatchWorker({"echo": runner}, connection=redis, settings=settings, name="peek").work(burst=True)
    ((record_ttl, job_ttl),) = Peeking.seen
    # Set just after the job's start gave its hash its running TTL: the same life, less the moments between.
    assert job_ttl - 60 <= record_ttl <= job_ttl
