"""The failover kill test: a Sentinel group (a primary, two replicas, three sentinels), two API processes, two
workers, the webhook sender and a webhook receiver; a steady stream of submits, each with an Idempotency-Key and
a webhook; the primary killed with SIGKILL midway.

With INFERQ_DURABILITY=replica every job that got a 202 ends once with its own result, never reads 404, keeps
its ID under a retried Idempotency-Key, and has its webhook delivered (at least once, one webhook-id). With
async the same run reports how many acknowledged jobs the failover lost: that loss is what async allows.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.ha import SentinelGroup
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until, wait_while_moving
from tests.support.webhooks import Receiver

pytestmark = pytest.mark.timeout(1800)  # a hang guard: beside four busy loops its webhooks alone took 7 minutes
JOBS = 1200
RATE_PER_S = 80.0
SENDERS = 12
KILL_AFTER = JOBS // 2


@dataclass
class Run:
    """What the clients saw: each key's job, every answer's time and status, and reads after a 202."""

    ids: dict[int, str] = field(default_factory=dict)
    answers: list[tuple[float, int]] = field(default_factory=list)
    killed_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def _inputs(n: int) -> list[float]:
    """Job n's own input (never the test model's poison value, 666): its result must be exactly this."""
    return [n + 0.25, -n - 0.25]


def _client_submit(base: str, run: Run, n: int, hook: str, deadline: float) -> None:
    """One client's submit of job n: retried with its Idempotency-Key on 503 or a broken connection."""
    body = {"inputs": _inputs(n), "webhook": hook}
    with httpx.Client(timeout=10) as client:
        while time.monotonic() < deadline:
            try:
                response = client.post(f"{base}/v1/models/slow/jobs", json=body, headers={"Idempotency-Key": f"k{n}"})
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            with run.lock:
                run.answers.append((time.monotonic(), response.status_code))
            if response.status_code in (200, 202):
                with run.lock:
                    run.ids[n] = response.json()["id"]
                return
            assert response.status_code == 503, response.text  # never a 500, never a 4xx for a good request
            time.sleep(0.2)


def _load(stack: Stack, group: SentinelGroup, hook: str) -> Run:
    run = Run()
    deadline = time.monotonic() + 240
    with ThreadPoolExecutor(SENDERS) as pool:
        futures = []
        started = time.monotonic()
        for n in range(JOBS):
            # A steady rate: job n leaves at started + n / RATE_PER_S.
            time.sleep(max(0.0, started + n / RATE_PER_S - time.monotonic()))
            if n == KILL_AFTER:
                group.kill_primary()
                run.killed_at = time.monotonic()
            futures.append(pool.submit(_client_submit, stack.base, run, n, hook, deadline))
        for future in futures:
            future.result()
    return run


def _final(stack: Stack, run: Run) -> dict[int, dict[str, Any]]:
    """Each acknowledged job's view once terminal (or its 404); waits until none is still queued or running."""
    views: dict[int, dict[str, Any]] = {}
    pending = dict(run.ids)
    deadline = time.monotonic() + 240
    with httpx.Client(timeout=10) as client:
        while pending and time.monotonic() < deadline:
            for n, job_id in list(pending.items()):
                response = client.get(f"{stack.base}/v1/jobs/{job_id}")
                if response.status_code == 503:
                    continue
                view = {"status": "missing"} if response.status_code == 404 else response.json()
                views[n] = view
                if view["status"] in ("finished", "failed", "canceled", "expired", "missing"):
                    del pending[n]
            time.sleep(0.5)
    return views


@pytest.fixture(params=["replica", "async"])
def failover(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Stack, SentinelGroup, Receiver]]:
    mode = request.param
    hooks = Receiver(statuses=[204])
    with SentinelGroup(tmp_path / "ha", replicas=2, sentinels=3, down_after_ms=1000) as group:
        env = {
            "INFERQ_DURABILITY": mode,
            "INFERQ_DURABILITY_TIMEOUT_MS": "500",
            "INFERQ_REDIS_TIMEOUT_S": "1",
            "INFERQ_TEST_SLOW_S": "0",
            "INFERQ_MAX_QUEUE_LENGTH": str(JOBS * 2),
            "INFERQ_WORKER_TTL_S": "16",
            "INFERQ_HEARTBEAT_TTL_S": "6",
            "INFERQ_MAINTENANCE_INTERVAL_S": "5",
        }
        stack = new_stack(tmp_path, server=group.servers[0], redis_url=group.url, **env)
        with serving(stack):
            stack.start("api", "--port", str(stack.port), "--workers", "2", name="api")
            wait_until(lambda: _ready(stack), 60, "the API")
            stack.start_worker("slow", name="worker-1")
            stack.start_worker("slow", name="worker-2")
            stack.start("webhooks", name="webhooks")
            stack.wait_for_worker("slow")
            yield mode, stack, group, hooks
    hooks.close()


def _ready(stack: Stack) -> bool:
    try:
        return httpx.get(f"{stack.base}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_primary_killed_midway(failover: tuple[str, Stack, SentinelGroup, Receiver]) -> None:
    mode, stack, group, hooks = failover
    run = _load(stack, group, hooks.url)
    assert run.killed_at is not None
    views = _final(stack, run)
    lost = sorted(n for n, view in views.items() if view["status"] == "missing")
    after_kill = [(t - run.killed_at, status) for t, status in run.answers if t >= run.killed_at]
    # How long the API answered 503 after the kill: until its last 503 (answers in flight at the kill may be 202s).
    unavailable_s = max((dt for dt, status in after_kill if status == 503), default=0.0)
    report = {
        "mode": mode,
        "acknowledged": len(run.ids),
        "lost": len(lost),
        "503_for_s_after_kill": round(unavailable_s, 2),
        "503s": sum(1 for _, status in run.answers if status == 503),
    }
    print("failover:", json.dumps(report))
    (stack.tmp / "failover.json").write_text(json.dumps(report))
    assert len(run.ids) == JOBS  # every client got its 202 in the end (503s retried with their key)
    assert unavailable_s < 60  # recovered by itself (a hang guard; the time itself is measured and reported)
    # Idempotency-Key retries return the original ID.
    with httpx.Client(timeout=10) as client:
        for n in range(0, JOBS, 97):
            again = client.post(
                f"{stack.base}/v1/models/slow/jobs",
                json={"inputs": _inputs(n), "webhook": hooks.url},
                headers={"Idempotency-Key": f"k{n}"},
            )
            if mode == "replica" or n not in lost:
                assert again.status_code in (200, 202) and again.json()["id"] == run.ids[n], again.text
    if mode == "async":
        return  # the loss is reported above; async promises no more
    assert lost == [], f"acknowledged jobs lost: {lost[:20]}"
    unfinished = {n: view for n, view in views.items() if view["status"] != "finished"}
    assert not unfinished, {n: (v["status"], v.get("error")) for n, v in list(unfinished.items())[:10]}
    for n, view in views.items():
        assert view["result"] == {"output": _inputs(n)}, (n, view)
    # One sender sends one webhook at a time: 1,200 of them took 6 minutes and more beside four busy loops (not a
    # speed claim), so the wait lasts while deliveries keep coming.
    expected = set(run.ids.values())
    wait_while_moving(lambda: len(hooks.deliveries), lambda: _delivered(hooks) >= expected, 120, "every webhook")
    ids = {}
    for delivery in hooks.deliveries:
        body = json.loads(delivery["body"])
        ids.setdefault(body["id"], set()).add(delivery["headers"]["webhook-id"])
        assert body["status"] == "finished"
    assert all(len(webhook_ids) == 1 for webhook_ids in ids.values())


def _delivered(hooks: Receiver) -> set[str]:
    return {json.loads(d["body"])["id"] for d in hooks.deliveries}
