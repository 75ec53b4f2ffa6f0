"""inferq on a Redis Sentinel group (real primary, replicas and sentinels): every process finds the primary by
itself after a failover, and ``rq info`` reads the group through inferq's rq config module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_py

from inferq.shared import connections
from inferq.shared.redis_server import free_port
from tests.support.ha import SERVICE, SentinelGroup
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until

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
