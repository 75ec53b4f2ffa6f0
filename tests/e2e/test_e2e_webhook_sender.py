"""A webhook sender killed mid-attempt: the next sender delivers again (``inferq webhooks`` as real processes)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from inferq.shared.redis_server import free_port
from inferq.shared.settings import Settings
from tests.support.stack import new_stack, serving
from tests.support.waiting import wait_until
from tests.support.webhooks import attempts, queue_delivery


class HoldingReceiver:
    """Holds the first request open (its sender is killed meanwhile); answers 204 to the next ones."""

    def __init__(self) -> None:
        self.webhook_ids: list[str] = []
        self.first_arrived = threading.Event()
        self.release = threading.Event()
        self.port = free_port()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                receiver.webhook_ids.append(self.headers["webhook-id"])
                if len(receiver.webhook_ids) == 1:
                    receiver.first_arrived.set()
                    receiver.release.wait(60)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def close(self) -> None:
        self.release.set()
        self.http.shutdown()
        self.http.server_close()


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (Linux /proc): RQ forks the sender's scheduler."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.fixture
def holding_receiver() -> Iterator[HoldingReceiver]:
    receiver = HoldingReceiver()
    yield receiver
    receiver.close()


def test_a_sender_killed_mid_attempt_is_redelivered_by_the_next_sender(
    tmp_path: Path, holding_receiver: HoldingReceiver
) -> None:
    env = {"INFERQ_HEARTBEAT_TTL_S": "3", "INFERQ_MAINTENANCE_INTERVAL_S": "1", "INFERQ_WEBHOOK_TIMEOUT_S": "30"}
    with serving(new_stack(tmp_path, **env)) as stack:
        client = stack.redis()
        settings = Settings(redis_url=stack.redis_url, webhook_timeout_s=30)
        job_id = queue_delivery(client, settings, holding_receiver.url)
        doomed = stack.start("webhooks", name="doomed-sender")
        assert holding_receiver.first_arrived.wait(30), stack.log_text()
        # A deploy's SIGKILL takes the whole container: the sender and the scheduler it forked.
        for pid in [*_children(doomed.pid), doomed.pid]:
            os.kill(pid, signal.SIGKILL)
        doomed.wait()
        killed_at = time.monotonic()
        stack.start("webhooks", name="next-sender")
        wait_until(lambda: len(holding_receiver.webhook_ids) >= 2, 45, "the webhook to be delivered again")
        assert time.monotonic() - killed_at < 60
        assert holding_receiver.webhook_ids == [f"msg_{job_id}", f"msg_{job_id}"]

        def recorded() -> bool:
            return [a["outcome"] for a in attempts(client, job_id)] == ["delivered"]

        wait_until(recorded, 10, "the delivered attempt to be recorded")
        assert attempts(client, job_id) == [
            {"attempt": 1, "status_code": 204, "response_bytes": 0, "outcome": "delivered"}
        ]
        client.close()
