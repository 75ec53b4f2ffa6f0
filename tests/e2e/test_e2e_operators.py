"""Operators' tools against a real stack: `rq info` and rq-dashboard see every queue and every worker.

`rq info` lists the queues in RQ's queues set, and RQ adds a queue there only when something is
enqueued: the webhook sender and every bulk lane stayed invisible until first used. rq-dashboard
reads a busy worker's current job with pickle whatever its `--json` says, so naming a JSON job
there made its workers page answer 500 while any worker was busy.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferq.shared.redis_server import free_port
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until

BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    local = BIN / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (it comes with `make setup`'s dev extra)")
    return found


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = new_stack(tmp_path_factory.mktemp("ops"), INFERQ_TEST_SLOW_S="4")
    with serving(stack):
        stack.start_api()
        stack.start_worker("slow")
        stack.start("webhooks", name="webhooks")
        stack.wait_for_worker("slow")
        client = stack.redis()
        wait_until(
            lambda: any(b"inferq.webhooks" in (client.hget(k, "queues") or b"") for k in client.smembers("rq:workers")),
            30,
            "the webhook sender",
        )
        client.close()
        yield stack


def test_rq_info_lists_every_queue_and_worker_before_any_job(ops: Stack) -> None:
    client = ops.redis()
    assert not client.keys("rq:job:*")  # no job was ever submitted
    client.close()
    out = subprocess.run(
        [_tool("rq"), "info", "-u", ops.redis_url], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    for queue in ("inferq.slow ", "inferq.slow.bulk", "inferq.webhooks"):
        assert queue in out, out
    assert "2 workers" in out, out


class _SlowReceiver:
    """Answers each webhook after ``delay_s``, so the sender is busy while a test looks."""

    def __init__(self, delay_s: float) -> None:
        self.hits = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver.hits += 1
                self.rfile.read(int(self.headers.get("content-length", 0)))
                time.sleep(delay_s)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_rq_dashboard_reads_busy_workers(ops: Stack, tmp_path: Path) -> None:
    port = free_port()
    with (tmp_path / "dashboard.log").open("wb") as log:
        dashboard = subprocess.Popen(
            [_tool("rq-dashboard"), "--json", "--redis-url", ops.redis_url, "--port", str(port), "--bind", "127.0.0.1"],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    receiver = _SlowReceiver(delay_s=4)
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{base}/0/data/queues.json", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 30, "rq-dashboard")
        # A slow batch keeps the model's worker busy; then its webhook, answered slowly, keeps the sender busy.
        body = {"inputs": [1, 2], "webhook": receiver.url}
        httpx.post(f"{ops.base}/v1/models/slow/jobs", json=body).raise_for_status()

        def states() -> dict[str, str]:
            response = httpx.get(f"{base}/0/data/workers.json", timeout=10)
            assert response.status_code == 200, response.text  # was 500: a pickle load of a JSON job
            return {w["name"]: w["state"] for w in response.json()["workers"]}

        wait_until(lambda: any(s == "busy" for n, s in states().items() if n.startswith("slow")), 30, "a busy worker")
        wait_until(lambda: receiver.hits > 0, 30, "the webhook delivery to start")
        busy = states()
        assert any(s == "busy" for n, s in busy.items() if n.startswith("webhooks")), busy
        queues = {q["name"]: q for q in httpx.get(f"{base}/0/data/queues.json", timeout=10).json()["queues"]}
        assert {"inferq.slow", "inferq.slow.bulk", "inferq.webhooks"} <= set(queues)
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=10)
        receiver.server.shutdown()
        receiver.server.server_close()


def test_the_sample_webhook_receiver_verifies_a_real_delivery(ops: Stack, tmp_path: Path) -> None:
    """docs/webhooks.md's local-webhook walk-through: samples/webhook_receiver.py with the sender's secret."""
    port = free_port()
    with (tmp_path / "receiver.log").open("wb") as log:
        receiver = subprocess.Popen(
            [sys.executable, str(ROOT / "samples" / "webhook_receiver.py"), str(port)],
            cwd=ROOT,
            env=ops.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "listening" in (tmp_path / "receiver.log").read_text(), 30, "the receiver")
        body = {"inputs": [3, 4], "webhook": f"http://127.0.0.1:{port}/hook"}
        job_id = httpx.post(f"{ops.base}/v1/models/slow/jobs", json=body).json()["id"]
        wait_until(lambda: "verified" in (tmp_path / "receiver.log").read_text(), 60, "a verified delivery")
        expected = f"verified msg_{job_id}: {job_id} finished " + '{"output": [3.0, 4.0]}'
        assert expected in (tmp_path / "receiver.log").read_text()
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
