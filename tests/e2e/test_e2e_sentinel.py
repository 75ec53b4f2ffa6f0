"""inferq on a Redis Sentinel group (real primary, replicas and sentinels): every process finds the primary by
itself after a failover, and ``rq info`` reads the group through inferq's rq config module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import pytest
import redis as redis_py
from rq.scheduler import SCHEDULER_KEY_TEMPLATE, SCHEDULER_LOCKING_KEY_TEMPLATE
from rq.utils import utcparse

from inferq.shared import connections, keys
from inferq.shared.jobs import utcnow
from inferq.shared.redis_server import free_port
from tests.support.ha import SERVICE, SentinelGroup
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until
from tests.support.webhooks import Receiver

pytestmark = pytest.mark.timeout(300)
ENV = {"INFERQ_REDIS_TIMEOUT_S": "1", "INFERQ_WORKER_TTL_S": "16"}


def submit(stack: Stack, value: float, wait_s: float = 0) -> httpx.Response:
    headers = {"Prefer": f"wait={wait_s:g}"} if wait_s else {}
    return httpx.post(
        f"{stack.base}/v1/models/slow/jobs", json={"inputs": [value, value]}, headers=headers, timeout=10 + wait_s
    )


def view(stack: Stack, job_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{stack.base}/v1/jobs/{job_id}", timeout=10).json())


def rq_info(url: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "rq"), "info", "-c", "inferq.rqconfig"],
        env=env | {"INFERQ_REDIS_URL": url, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_every_process_follows_a_failover_by_itself(tmp_path: Path) -> None:
    with (
        SentinelGroup(tmp_path / "ha", replicas=1) as group,
        serving(new_stack(tmp_path, server=group.servers[0], redis_url=group.url, **ENV)) as stack,
    ):
        stack.start_api()
        stack.start_worker("slow", name="worker")
        stack.start("webhooks", name="webhooks")
        stack.wait_for_worker("slow")
        before = submit(stack, 1.0, wait_s=20)
        assert before.status_code == 200, before.text
        shown = rq_info(group.url)
        assert "inferq.slow" in shown and "inferq.webhooks" in shown, shown

        old = group.primary_port()
        with redis_py.Redis(port=group.sentinels[0].port) as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)  # the old primary becomes a read-only replica
        new = group.wait_for_new_primary(old)
        assert new != old

        wait_until(lambda: submit(stack, 2.0).status_code == 202, 30, "a submit on the new primary")
        after = submit(stack, 3.0, wait_s=30)
        assert after.status_code == 200 and after.json()["result"] == {"output": [3.0, 3.0]}, after.text
        assert view(stack, before.json()["id"])["result"] == {"output": [1.0, 1.0]}  # replicated before the failover
        exited = [log.name for proc, log in zip(stack.procs, stack.logs, strict=True) if proc.poll() is not None]
        assert not exited, stack.log_text()
        with connections.connect(group.url, 2.0) as client:
            assert client.info("server")["tcp_port"] == new
            wait_until(lambda: len(client.smembers("rq:workers")) == 2, 30, "both workers registered on it")
        assert "inferq.slow" in rq_info(group.url)


def _dashboard_data(base: str, what: str) -> dict[str, Any] | None:
    """rq-dashboard's JSON of ``what`` (queues, workers), or None while it does not answer it."""
    try:
        answer = httpx.get(f"{base}/0/data/{what}.json", timeout=5)
    except httpx.HTTPError:
        return None
    return dict(answer.json()) if answer.status_code == 200 else None


def test_rq_dashboard_serves_a_sentinel_group_and_follows_its_failover(tmp_path: Path) -> None:
    """docs/redis.md: the command `inferq up` prints, a redis+sentinel:// URL, serves the group's queues and workers,
    and finds the new primary once the old one is gone (rq-dashboard 0.9.0 connects with redis-py's Sentinel
    client, through the redis-sentinel-url package)."""
    dashboard_bin = Path(sys.executable).parent / "rq-dashboard"
    if not dashboard_bin.exists():
        pytest.skip("rq-dashboard is not installed (it comes with `make setup`'s dev extra)")
    with (
        SentinelGroup(tmp_path / "ha", replicas=1) as group,
        serving(new_stack(tmp_path, server=group.servers[0], redis_url=group.url, **ENV)) as stack,
    ):
        stack.start_worker("slow", name="worker")
        stack.start("webhooks", name="webhooks")
        stack.wait_for_worker("slow")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        with (tmp_path / "dashboard.log").open("wb") as log:
            dashboard = subprocess.Popen(
                [str(dashboard_bin), "--json", "--redis-url", group.url, "--port", str(port), "--bind", "127.0.0.1"],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:

            def serves(names: set[str]) -> bool:
                queues, workers = _dashboard_data(base, "queues"), _dashboard_data(base, "workers")
                if queues is None or workers is None:
                    return False
                shown = {q["name"] for q in queues["queues"]}
                prefixes = {w["name"].split(".")[0] for w in workers["workers"]}
                return names <= shown and {"slow", "webhooks"} <= prefixes

            wait_until(lambda: serves({"inferq.slow", "inferq.slow.bulk", "inferq.webhooks"}), 60, "the dashboard")
            old = group.kill_primary()
            new = group.wait_for_new_primary(old)
            assert new != old
            # Only the new primary answers now: the dashboard asked the sentinels where it is.
            wait_until(lambda: serves({"inferq.slow", "inferq.webhooks"}), 60, "the dashboard on the new primary")
            assert dashboard.poll() is None, (tmp_path / "dashboard.log").read_text()
        finally:
            dashboard.terminate()
            dashboard.wait(timeout=10)


class Interrupted(Exception):
    """What a signal handler raises into a blocking read, as RQ's stop raises StopRequested into a worker's pop."""


def test_a_read_cut_short_on_a_sentinel_connection_leaves_no_reply_for_the_next_command(tmp_path: Path) -> None:
    """The connection of a blocking pop cut short by a signal is dropped, not handed to the next command with the
    pop's reply still to come: the worker's and the sender's stop (RQ's register_death pipeline) failed on it."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    with SentinelGroup(tmp_path / "ha", replicas=1) as group, connections.connect(group.url, 5.0) as client:
        client.ping()
        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Interrupted):
                client.blpop(["nothing-arrives"], timeout=2)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        with client.pipeline() as pipeline:
            pipeline.set("after", "1")
            pipeline.get("after")
            assert pipeline.execute() == [True, b"1"]


def _scheduler(client: redis_py.Redis) -> tuple[int, datetime] | None:
    """The webhook sender's scheduler as its hash tells it: its PID and last heartbeat; None before it registered."""
    owner = client.get(SCHEDULER_LOCKING_KEY_TEMPLATE % keys.WEBHOOK_QUEUE)
    if owner is None:
        return None
    found = client.hgetall(SCHEDULER_KEY_TEMPLATE % owner.decode())
    if b"pid" not in found or b"last_heartbeat" not in found:
        return None
    return int(found[b"pid"]), utcparse(found[b"last_heartbeat"].decode())


def test_a_primary_killed_and_left_down_is_waited_out_in_silence_and_the_stop_after_is_clean(tmp_path: Path) -> None:
    """The primary SIGKILLed and never started again: every process follows the sentinels to the new primary with one
    line when Redis is lost and one when it is back. No ERROR from RQ's command channel or the sender's dequeue (RQ
    logged one every 2 s of the outage), no death of the sender's scheduler (RQ's ended at its first heartbeat that
    met the outage, with a traceback), and no traceback at the stop (register_death's pipeline)."""
    hooks = Receiver(statuses=[204])
    with (
        SentinelGroup(tmp_path / "ha", replicas=2) as group,
        serving(new_stack(tmp_path, server=group.servers[0], redis_url=group.url, **ENV)) as stack,
    ):
        stack.start_api()
        stack.start_worker("slow", name="worker")
        stack.start("webhooks", name="webhooks")
        stack.wait_for_worker("slow")
        with connections.connect(group.url, 2.0) as client:
            wait_until(lambda: _scheduler(client) is not None, 60, "the webhook scheduler to register")
            found = _scheduler(client)
            assert found is not None
            scheduler_pid = found[0]

        old = group.kill_primary()
        group.wait_for_new_primary(old)
        failed_over_at = utcnow()
        # The worker and the sender both serve on the new primary: a job runs, and its webhook is delivered.
        wait_until(lambda: submit(stack, 2.0).status_code == 202, 30, "a submit on the new primary")
        body = {"inputs": [4.0, 4.0], "webhook": hooks.url}
        after = httpx.post(f"{stack.base}/v1/models/slow/jobs", json=body, headers={"Prefer": "wait=30"}, timeout=40)
        assert after.status_code == 200 and after.json()["result"] == {"output": [4.0, 4.0]}, after.text
        wait_until(lambda: len(hooks.deliveries) == 1, 60, "the job's webhook, sent after the failover")
        with connections.connect(group.url, 2.0) as client:
            assert client.info("server")["tcp_port"] != old
            # The scheduler of before heartbeats on the new primary: the same process, not one started after a death.
            wait_until(
                lambda: (now := _scheduler(client)) is not None and now[1] > failed_over_at,
                60,
                "the scheduler's heartbeat on the new primary",
            )
            found = _scheduler(client)
            assert found is not None and found[0] == scheduler_pid, stack.log_text()
            # RQ's command channels (the worker's and the sender's) are subscribed on the new primary too.
            wait_until(lambda: len(client.pubsub_channels("rq:pubsub:*")) == 2, 30, "both command channels on it")
        stopped = list(zip(stack.procs, stack.logs, strict=True))
        stack.stop_all()
        for proc, log in stopped:
            text = log.read_text(errors="replace")
            if not log.name.startswith("api"):  # uvicorn ends by raising the SIGTERM it caught again
                assert proc.returncode == 0, f"{log.name}: exit {proc.returncode}\n{text}"
            assert " ERROR " not in text and "Traceback" not in text, f"{log.name}:\n{text}"
        sender = next(log for _, log in stopped if log.name.startswith("webhooks")).read_text()
        assert sender.count("Scheduler for inferq.webhooks started with PID") == 1, sender
    hooks.close()
