"""A batch whose start meets a Redis outage runs once Redis is back, whether or not the start ran.

The start is one Lua script: when the connection drops the worker cannot tell whether Redis ran it
(the reply was lost) or never got it (the jobs still wait, popped, in the intermediate list). Either
way the jobs were accepted, and must not wait for RQ's cleanup, which fails a job left popped for a
minute and leaves one marked started by a live worker alone until its heartbeat lapses.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis as redis_py
from rq.worker import SimpleWorker

from inferq.shared import keys
from inferq.shared.jobs import QueueCache, Submission, enqueue_job, get_job_view
from inferq.shared.lifecycle import claims
from inferq.shared.settings import Settings
from inferq.workers import batching
from inferq.workers.batching import BatchWorker
from tests.support.echo import echo_runner


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url)


def _submit(redis: redis_py.Redis, settings: Settings, value: float, retries: int | None = None) -> str:
    payload = json.dumps({"inputs": [value, -value]}).encode()
    submission = Submission("echo", payload, "application/json", retries=retries)
    return enqueue_job(QueueCache(redis), settings, submission).id


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
        monkeypatch.setattr(batching.claims, "started", _once(batching.claims.started, before=False))
    else:  # the start never reached Redis
        monkeypatch.setattr(batching.claims, "start", _once(batching.claims.start, before=True))
    monkeypatch.setattr(batching.time, "sleep", lambda s: None)
    worker = BatchWorker({"echo": echo_runner(max_batch=4)}, connection=redis, settings=settings, name="w")
    worker.work(burst=True)
    views = [get_job_view(redis, i) for i in ids]
    assert [v["status"] for v in views] == ["finished"] * 6
    assert [v["result"] for v in views] == [{"output": [float(i), float(-i)]} for i in range(6)]
    assert [v["batch_size"] for v in views] == [4] * 4 + [2] * 2  # the first batch ran as it was, in order
    assert redis.llen("rq:queue:inferq.echo:intermediate") == 0
    assert redis.zcard("rq:wip:inferq.echo") == 0
    assert redis.zcard("rq:finished:inferq.echo") == 6
    assert redis.zcard("rq:failed:inferq.echo") == 0


def _strand(redis: redis_py.Redis, cleaner: BatchWorker, job_ids: list[str]) -> None:
    """Pop ``job_ids`` as a worker that then died would, and let a minute of maintenance pass over them."""
    queue = cleaner.queues[0]
    for _ in job_ids:
        redis.lmove(queue.key, queue.intermediate_queue_key)
    cleaner.clean_registries()  # RQ's pass notes when it first saw them
    for job_id in job_ids:  # ...a minute and more ago
        redis.set(queue.intermediate_queue.get_first_seen_key(job_id), time.time() - 120)
    cleaner.clean_registries()


def test_jobs_a_worker_popped_but_died_before_starting_run_instead_of_failing(
    redis: redis_py.Redis, settings: Settings
) -> None:
    """RQ's cleanup retried them, spending a retry on a run that never was, or failed them with none left."""
    ids = [_submit(redis, settings, i, retries=0) for i in range(3)]
    cleaner = BatchWorker({"echo": echo_runner(max_batch=4)}, connection=redis, settings=settings, name="cleaner")
    _strand(redis, cleaner, ids)
    queue = cleaner.queues[0]
    assert redis.lrange(queue.key, 0, -1) == [i.encode() for i in ids]  # in front, in order
    assert redis.llen(queue.intermediate_queue_key) == 0
    assert [get_job_view(redis, i)["status"] for i in ids] == ["queued"] * 3
    assert redis.zcard("rq:failed:inferq.echo") == 0
    cleaner.work(burst=True)
    views = [get_job_view(redis, i) for i in ids]
    assert [v["result"] for v in views] == [{"output": [float(i), float(-i)]} for i in range(3)]


def test_a_job_stranded_again_and_again_is_failed_once_it_was_put_back_the_limit(
    redis: redis_py.Redis, settings: Settings
) -> None:
    """A payload that kills its worker while the batch is prepared ahead must not loop for ever."""
    job_id = _submit(redis, settings, 1, retries=0)
    cleaner = BatchWorker({"echo": echo_runner(max_batch=4)}, connection=redis, settings=settings, name="cleaner")
    for _ in range(claims.RESCUE_LIMIT):
        _strand(redis, cleaner, [job_id])
        assert get_job_view(redis, job_id)["status"] == "queued"
    _strand(redis, cleaner, [job_id])
    view = get_job_view(redis, job_id)
    assert view["status"] == "failed" and "intermediate" in view["error"]
    assert redis.llen(cleaner.queues[0].key) == 0
    assert redis.ttl(keys.info_key(job_id)) > 0  # the rescue count lives in the info hash, which still expires


@pytest.mark.parametrize("step", ["subscribe", "set_state"])
def test_an_outage_right_after_the_worker_registers_is_waited_out_not_a_crash(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """RQ's bootstrap goes on after the registration (its channel, its state): a busy or lost Redis there used to end
    the worker with the traceback of a BUSY reply (a loaded CI run: a script began just after the worker registered)."""
    ids = [_submit(redis, settings, i) for i in range(3)]
    real = getattr(SimpleWorker, step)
    calls = []

    def busy_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise redis_py.exceptions.ResponseError(
                "BUSY Redis is busy running a script. You can only call SCRIPT KILL"
            )
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SimpleWorker, step, busy_once)
    monkeypatch.setattr(batching.time, "sleep", lambda s: None)
    worker = BatchWorker({"echo": echo_runner(max_batch=4)}, connection=redis, settings=settings, name="w")
    worker.work(burst=True)
    assert len(calls) >= 2  # tried again (or, for its state, skipped and written by the next change)
    assert [get_job_view(redis, i)["status"] for i in ids] == ["finished"] * 3


@pytest.mark.parametrize("lost", ["queue registration", "birth reply"])
@pytest.mark.parametrize("kind", ["worker", "webhook sender"])
def test_a_registration_whose_birth_went_through_is_not_taken_for_a_second_worker(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, lost: str, kind: str
) -> None:
    """A loaded CI run: the sender's birth was written, its queue registration met a script (BUSY), and trying the
    whole registration again ended it with RQ's "There exists an active worker named ... already"."""
    from inferq.workers import webhooks

    module = batching if kind == "worker" else webhooks
    calls: list[int] = []
    if lost == "queue registration":
        real_queues = module.register_queues

        def busy_once(*args: Any) -> Any:
            calls.append(1)
            if len(calls) == 1:
                raise redis_py.exceptions.ResponseError("BUSY Redis is busy running a script. You can only call ...")
            return real_queues(*args)

        monkeypatch.setattr(module, "register_queues", busy_once)
    else:  # the birth's transaction ran; its reply never came
        real_birth = SimpleWorker.register_birth

        def lost_reply(self: Any) -> None:
            calls.append(1)
            real_birth(self)
            if len(calls) == 1:
                raise redis_py.exceptions.ConnectionError("Error while reading from redis: Connection reset by peer")

        monkeypatch.setattr(SimpleWorker, "register_birth", lost_reply)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    if kind == "worker":
        worker: Any = BatchWorker({"echo": echo_runner(max_batch=4)}, connection=redis, settings=settings, name="w")
    else:
        worker = webhooks.webhook_worker(redis, settings, name="w")
    worker.register_birth()
    # Tried again from where it was: the queues registered on a second call, the birth that went through kept.
    assert len(calls) == (2 if lost == "queue registration" else 1)
    assert redis.hget(worker.key, "queues") and not redis.hexists(worker.key, "death")
    assert worker.key.encode() in redis.smembers("rq:workers")
    worker.register_death()
