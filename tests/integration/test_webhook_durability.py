"""INFERQ_DURABILITY=replica: a webhook tells an end only once a replica has it, as the end's event does
(shared/durability.py), on a private primary whose replica starts only later, and a real in-process sender."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from rq.registry import ScheduledJobRegistry

from inferq.shared import durability, keys
from inferq.shared.jobs import QueueCache, Submission, cancel_job, enqueue_job
from inferq.shared.redis_server import RedisServer
from inferq.shared.settings import Settings, get_settings
from inferq.workers.webhooks import webhook_worker
from tests.support.waiting import wait_until
from tests.support.webhooks import Receiver, attempts


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "primary", appendonly=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch, primary: RedisServer) -> Iterator[Settings]:
    """The sender's settings (deliver() reads the environment's, as in production): one replica must confirm."""
    env = {
        "INFERQ_REDIS_URL": primary.url,
        "INFERQ_DURABILITY": "replica",
        "INFERQ_DURABILITY_REPLICAS": "1",
        "INFERQ_DURABILITY_TIMEOUT_MS": "100",
        "INFERQ_WEBHOOK_ALLOW": "127.0.0.1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


def test_a_webhook_waits_until_a_replica_has_the_end_it_tells(
    tmp_path: Path, primary: RedisServer, settings: Settings
) -> None:
    """Issue 45 item 22: with the replica down, the sender delivered the end of a job no replica had confirmed."""
    redis = redis_py.Redis.from_url(primary.url)
    receiver = Receiver(statuses=[204])
    replica: RedisServer | None = None
    try:
        queues = QueueCache(redis)
        submission = Submission("m", b"x", "application/octet-stream", webhook=receiver.url)
        job_id = enqueue_job(queues, settings, submission).id
        with pytest.raises(durability.NotConfirmed):
            cancel_job(queues, settings, job_id)  # the cancel is in Redis, its delivery queued; no replica confirms it
        assert redis.llen(f"rq:queue:{keys.WEBHOOK_QUEUE}") == 1
        webhook_worker(redis, settings).work(burst=True)
        assert receiver.deliveries == []
        assert attempts(redis, job_id) == []  # no attempt was spent
        waiting = ScheduledJobRegistry(keys.WEBHOOK_QUEUE, connection=redis)
        assert waiting.count == 1  # it looks again soon

        replica = RedisServer(tmp_path / "replica", appendonly=False, options=("--replicaof", *_address(primary)))
        replica.start()

        def online() -> Any:
            return durability.online_replicas(redis.info("replication")) >= 1

        wait_until(online, 30, "the replica to catch up")

        def delivered() -> bool:
            webhook_worker(redis, settings).work(burst=True, with_scheduler=True)
            return bool(receiver.deliveries)

        wait_until(delivered, 30, "the delivery once a replica has the end")
    finally:
        receiver.close()
        if replica is not None:
            replica.stop()
        redis.close()
    assert [(a["status_code"], a["outcome"]) for a in attempts(redis, job_id)] == [(204, "delivered")]


def _address(server: RedisServer) -> tuple[str, str]:
    return server.host, str(server.port)
