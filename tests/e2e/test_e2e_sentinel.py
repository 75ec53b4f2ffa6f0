"""inferq on a Redis Sentinel group (real primary, replicas and sentinels): every process finds the primary by
itself after a failover, and ``rq info`` reads the group through inferq's rq config module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import pytest
import redis as redis_py

from inferq.shared import connections
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
