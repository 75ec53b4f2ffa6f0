"""A batch whose start meets a Redis outage runs once Redis is back, whether or not the start ran.

The start is one Lua script: when the connection drops the worker cannot tell whether Redis ran it
(the reply was lost) or never got it (the jobs still wait, popped, in the intermediate list). Either
way the jobs were accepted, and must not wait for RQ's cleanup, which fails a job left popped for a
minute and leaves one marked started by a live worker alone until its heartbeat lapses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis as redis_py

from shared.jobs import QueueCache, Submission, enqueue_job, get_job_view
from shared.settings import Settings
from tests.test_batching import _runner
from workers import batching
from workers.batching import BatchWorker


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url)


def _submit(redis: redis_py.Redis, settings: Settings, value: float) -> str:
    payload = json.dumps({"inputs": [value, -value]}).encode()
    return enqueue_job(QueueCache(redis), settings, Submission("echo", payload, "application/json")).id


def _once(real: Callable[..., Any], before: bool) -> Callable[..., Any]:
    """``real``, except that its first call drops the connection: before it runs, or after (reply lost)."""
    calls = []

    def call(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1 and before:
            raise redis_py.exceptions.ConnectionError("Connection reset by peer")
        out = real(*args, **kwargs)
        if len(calls) == 1:
            raise redis_py.exceptions.ConnectionError("Error while reading from redis: Connection reset by peer")
        return out

    return call


@pytest.mark.parametrize("lost", ["reply", "request"])
def test_a_batch_whose_start_lost_redis_runs_once_redis_is_back(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, lost: str
) -> None:
    ids = [_submit(redis, settings, i) for i in range(6)]
    if lost == "reply":  # the start script ran; the worker never saw its answer
        monkeypatch.setattr(batching.store, "started", _once(batching.store.started, before=False))
    else:  # the start never reached Redis
        monkeypatch.setattr(batching.store, "start", _once(batching.store.start, before=True))
    monkeypatch.setattr(batching.time, "sleep", lambda s: None)
    worker = BatchWorker({"echo": _runner(max_batch=4)}, connection=redis, settings=settings, name="w")
    worker.work(burst=True)
    views = [get_job_view(redis, i) for i in ids]
    assert [v["status"] for v in views] == ["finished"] * 6
    assert [v["result"] for v in views] == [{"output": [float(i), float(-i)]} for i in range(6)]
    assert [v["batch_size"] for v in views] == [4] * 4 + [2] * 2  # the first batch ran as it was, in order
    assert redis.llen("rq:queue:inferq.echo:intermediate") == 0
    assert redis.zcard("rq:wip:inferq.echo") == 0
    assert redis.zcard("rq:finished:inferq.echo") == 6
    assert redis.zcard("rq:failed:inferq.echo") == 0
