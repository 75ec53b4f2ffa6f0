"""What a killed run left registered in Redis is cleared at the next start, and nothing else is."""

from __future__ import annotations

import os
import socket
import subprocess
from datetime import UTC, datetime, timedelta

import redis as redis_py
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer
from rq.utils import utcformat
from rq.worker import Worker

from inferq.leftovers import clear_leftovers, process_alive
from inferq.shared.rqjson import JSONQueue

QUEUE = "inferq.digits"
HOST = socket.gethostname()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _worker(redis: redis_py.Redis, name: str, *, pid: int, hostname: str = HOST) -> Worker:
    worker = Worker([JSONQueue(QUEUE, connection=redis)], name=name, connection=redis, serializer=JSONSerializer)
    worker.pid, worker.hostname = pid, hostname  # as a process with that PID on that host registers itself
    worker.register_birth()
    return worker


def _scheduler(redis: redis_py.Redis, queue: str, name: str, *, pid: int, hostname: str = HOST) -> RQScheduler:
    scheduler = RQScheduler([queue], connection=redis, name=name)
    assert scheduler.acquire_locks() == {queue}
    scheduler.register_birth()
    redis.hset(scheduler.key, mapping={"pid": pid, "hostname": hostname})
    return scheduler


def test_dead_workers_and_locks_of_this_host_are_cleared_and_nothing_else(redis: redis_py.Redis) -> None:
    dead = _dead_pid()
    _worker(redis, "killed", pid=dead)
    _worker(redis, "alive", pid=os.getpid())
    _worker(redis, "elsewhere", pid=dead, hostname="another-host")
    # A PID reused by a later process: the worker registered long before this process began.
    _worker(redis, "reused", pid=os.getpid())
    redis.hset("rq:worker:reused", "birth", utcformat(datetime.now(UTC) - timedelta(days=3)))
    # Listed, but its hash expired (RQ keeps listing it until someone looks).
    redis.sadd("rq:workers", "rq:worker:expired")
    redis.sadd(f"rq:workers:{QUEUE}", "rq:worker:expired")
    _scheduler(redis, "inferq.webhooks", "dead-scheduler", pid=dead)
    _scheduler(redis, "inferq.live", "live-scheduler", pid=os.getpid())
    _scheduler(redis, "inferq.remote", "remote-scheduler", pid=dead, hostname="another-host")

    cleared = clear_leftovers(redis, [QUEUE, "inferq.live", "inferq.remote"])

    assert sorted(cleared.workers) == ["expired", "killed", "reused"]
    assert cleared.scheduler_locks == ["inferq.webhooks"]
    left = {"rq:worker:alive", "rq:worker:elsewhere"}
    assert {k.decode() for k in redis.smembers("rq:workers")} == left
    assert {k.decode() for k in redis.smembers(f"rq:workers:{QUEUE}")} == left
    assert redis.hexists("rq:worker:killed", "death")
    assert redis.get("rq:scheduler-lock:inferq.webhooks") is None
    assert not redis.exists("rq:scheduler:dead-scheduler")
    assert redis.get("rq:scheduler-lock:inferq.live") == b"live-scheduler"
    assert redis.get("rq:scheduler-lock:inferq.remote") == b"remote-scheduler"
    # The next scheduler takes the lock at once instead of a minute later.
    assert RQScheduler(["inferq.webhooks"], connection=redis).acquire_locks() == {"inferq.webhooks"}
    assert clear_leftovers(redis, [QUEUE]).workers == []


def test_process_alive() -> None:
    assert process_alive(os.getpid(), None)
    assert process_alive(os.getpid(), datetime.now(UTC))
    assert not process_alive(os.getpid(), datetime.now(UTC) - timedelta(days=1))
    assert not process_alive(_dead_pid(), None)
