"""INFERQ_DURABILITY against real servers and processes: what a 202, a cancel's 200 and an end event wait for.

``replica``: a submit with no replica to confirm it answers 503 (never a silent async), /readyz and /metrics say
why, and a replica connecting makes it 202 again; a job's end event is published only once a replica has its
result (a frozen replica holds the event back, the job's state is already there). ``fsync`` is refused with one
line by a server without WAITAOF.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_py

from inferq.shared import keys
from inferq.shared.redis_server import RedisServer, default_server, server_version
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis_facing
ENV = {"INFERQ_DURABILITY": "replica", "INFERQ_DURABILITY_TIMEOUT_MS": "300", "INFERQ_REDIS_TIMEOUT_S": "2"}


def submit(stack: Stack, value: float, **headers: str) -> httpx.Response:
    return httpx.post(f"{stack.base}/v1/models/slow/jobs", json={"inputs": [value, value]}, headers=headers, timeout=40)


@pytest.fixture
def lone(tmp_path: Path) -> Iterator[Stack]:
    """INFERQ_DURABILITY=replica on a Redis with no replica yet."""
    with serving(new_stack(tmp_path, **ENV)) as stack:
        stack.start("api", "--port", str(stack.port), name="api")
        wait_until(lambda: _live(stack), 30, "the API to answer /healthz")  # /readyz is 503: no replica
        yield stack


def _live(stack: Stack) -> bool:
    try:
        return httpx.get(f"{stack.base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_replica_with_no_replica_answers_503_says_why_and_recovers_when_one_connects(
    lone: Stack, tmp_path: Path
) -> None:
    refused = submit(lone, 1.0)
    assert refused.status_code == 503, refused.text
    assert "0 of 1 replica(s) confirmed" in refused.json()["error"]["message"]
    assert refused.headers["Retry-After"]
    ready = httpx.get(f"{lone.base}/readyz", timeout=10)
    assert ready.status_code == 503
    assert "INFERQ_DURABILITY=replica needs 1 connected replica(s), Redis has 0" in ready.json()["error"]["message"]
    scraped = httpx.get(f"{lone.base}/metrics", timeout=10).text
    assert 'inferq_durability{mode="replica"} 1.0' in scraped
    assert 'inferq_durability_unavailable{redis="default"} 1.0' in scraped
    assert httpx.get(f"{lone.base}/healthz", timeout=10).json() == {"status": "ok", "durability": "replica"}
    replica = RedisServer(
        tmp_path / "replica", appendonly=False, options=("--replicaof", "127.0.0.1", str(lone.redis_server.port))
    )
    replica.start()
    try:
        wait_until(lambda: httpx.get(f"{lone.base}/readyz", timeout=10).status_code == 200, 30, "/readyz 200")
        # As a client does: a 503 is retried with the same key (a replica that just came online may still be
        # loading its first copy, and confirm nothing for a moment).
        wait_until(lambda: submit(lone, 2.0, **{"Idempotency-Key": "k2"}).status_code == 202, 30, "a 202")
        accepted = submit(lone, 2.0, **{"Idempotency-Key": "k2"})
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["id"]
        with redis_py.Redis(port=replica.port) as on_replica:
            # Confirmed: the replica has the job and its Idempotency-Key before the client heard 202.
            assert on_replica.exists(f"rq:job:{job_id}")
            assert on_replica.exists(keys.idempotency_key("", "k2"))
        scraped = httpx.get(f"{lone.base}/metrics", timeout=10).text
        assert 'inferq_redis_connected_replicas{redis="default"} 1.0' in scraped
        assert 'inferq_durability_unavailable{redis="default"} 0.0' in scraped
    finally:
        replica.stop()


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[tuple[Stack, RedisServer]]:
    """INFERQ_DURABILITY=replica with one replica, the API and a `slow` worker."""
    with serving(new_stack(tmp_path, **ENV)) as stack:
        replica = RedisServer(
            tmp_path / "replica", appendonly=False, options=("--replicaof", "127.0.0.1", str(stack.redis_server.port))
        )
        replica.start()
        try:
            stack.start_api()
            stack.start_worker("slow", name="worker", env={"INFERQ_TEST_SLOW_S": "3"})  # a batch runs 3 s
            stack.wait_for_worker("slow")
            yield stack, replica
        finally:
            if replica.pid is not None:
                os.kill(replica.pid, signal.SIGCONT)
            replica.stop()


def test_an_end_event_waits_until_a_replica_has_the_result(replicated: tuple[Stack, RedisServer]) -> None:
    stack, replica = replicated
    events: list[dict[str, Any]] = []
    subscriber = stack.redis().pubsub()
    subscriber.subscribe(keys.EVENTS_CHANNEL)

    done = threading.Event()

    def listen() -> None:
        while not done.is_set():
            message = subscriber.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if message is not None:
                events.append(json.loads(message["data"]))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    warm = submit(stack, 1.0, Prefer="wait=20")
    assert warm.status_code == 200, warm.text
    held = submit(stack, 7.0)
    assert held.status_code == 202, held.text  # confirmed: the replica has it
    job = f"{stack.base}/v1/jobs/{held.json()['id']}"
    wait_until(lambda: httpx.get(job, timeout=10).json()["status"] == "started", 30, "the job to start")
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)  # frozen while the job runs: it acknowledges nothing
    try:
        client = stack.redis()
        wait_until(lambda: client.zcard("rq:finished:inferq.slow") == 2, 30, "the unconfirmed job to finish")
        ended = [e for e in events if e.get("status") == "finished"]
        assert len(ended) == 1  # the warm-up's: the second job's end is held back until a replica has it
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    wait_until(lambda: len([e for e in events if e.get("status") == "finished"]) == 2, 30, "the held event")
    done.set()
    listener.join()
    subscriber.close()


@pytest.mark.skipif(
    server_version(default_server()) >= (7, 2), reason="this server has WAITAOF: the refusal is for older ones"
)
def test_fsync_on_a_server_without_waitaof_is_refused_with_one_line(lone: Stack) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "inferq", "api", "--port", "0"],
        cwd=ROOT,
        env={**lone.env, "INFERQ_DURABILITY": "fsync"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 78, shown.stderr
    assert "INFERQ_DURABILITY=fsync needs WAITAOF (Redis or Valkey >= 7.2); this server is" in shown.stderr


@pytest.mark.skipif(server_version(default_server()) < (7, 2), reason="WAITAOF needs Redis or Valkey >= 7.2")
def test_fsync_acknowledges_once_the_aof_has_it(tmp_path: Path) -> None:
    env = {"INFERQ_DURABILITY": "fsync", "INFERQ_DURABILITY_TIMEOUT_MS": "1000", "INFERQ_REDIS_TIMEOUT_S": "3"}
    with serving(new_stack(tmp_path, appendonly=True, **env)) as stack:
        stack.start_api()
        stack.start_worker("slow", name="worker")
        stack.wait_for_worker("slow")
        done = submit(stack, 3.0, Prefer="wait=20")
        assert done.status_code == 200 and done.json()["result"] == {"output": [3.0, 3.0]}, done.text
        canceled = submit(stack, 4.0)
        assert canceled.status_code in (200, 202), canceled.text
