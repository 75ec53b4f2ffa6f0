"""RQ's own CLI on inferq's jobs: `rq info` against a real redis-server, beside an in-process batch worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis as redis_py

from inferq.shared import keys
from inferq.shared.jobs import get_job_view
from inferq.shared.rqjson import JSONJob
from inferq.shared.settings import Settings
from inferq.workers.batching import BatchWorker
from tests.support.echo import echo_runner, submit_echo


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url)


def test_rq_info_requeueing_a_dead_workers_batch_leaves_the_jobs_consistent(
    redis: redis_py.Redis, redis_url: str, settings: Settings
) -> None:
    """`rq info` is not read-only: counting the started registry runs RQ's cleanup, which requeues."""
    ids = [submit_echo(redis, settings, [i, i]) for i in range(3)]
    dead = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="dead-info")
    queue = dead.queues[0]
    redis.lmove(queue.key, queue.intermediate_queue_key)
    for job_id in ids:
        redis.expire(keys.payload_key(job_id), 5)  # they waited in the queue almost their whole queue TTL
    items = dead._start(queue, dead._collect(queue, ids[0], 4))
    redis.zadd("rq:wip:inferq.echo", {f"{i.job.id}:{i.job.execution_id}": 1 for i in items})  # heartbeats lapsed
    rq_cli = Path(sys.executable).parent / "rq"
    done = subprocess.run([str(rq_cli), "info", "-u", redis_url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(redis.lrange(queue.key, 0, -1)) == sorted(i.encode() for i in ids)  # requeued by rq info
    assert [get_job_view(redis, i)["status"] for i in ids] == ["queued"] * 3
    assert all(redis.ttl(keys.payload_key(i)) > settings.job_timeout_s for i in ids)  # inputs outlive a retry
    BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="after-info").work(burst=True)
    views = [get_job_view(redis, i) for i in ids]
    assert [v["status"] for v in views] == ["finished"] * 3
    assert [v["result"] for v in views] == [{"output": [float(i), float(i)]} for i in range(3)]
    assert redis.zcard("rq:wip:inferq.echo") == 0 and redis.llen(queue.intermediate_queue_key) == 0
    assert redis.zcard("rq:finished:inferq.echo") == 3 and redis.zcard("rq:failed:inferq.echo") == 0
    assert [redis.hget(JSONJob.key_for(i), "retries_left") for i in ids] == [b"1"] * 3
