"""Webhooks in tests: a local receiver (real HTTP, every delivery recorded with its headers), the secret the
stack signs with, and a delivery queued straight into Redis."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis as redis_py

from inferq.shared import keys
from inferq.shared.jobs import QueueCache, Submission, cancel_job, enqueue_job, get_job_view
from inferq.shared.redis_server import free_port
from inferq.shared.settings import Settings

WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Receiver:
    """A local webhook receiver; by default it fails each message's first delivery with a 500."""

    def __init__(self, statuses: list[int] | None = None, port: int | None = None) -> None:
        self.deliveries: list[dict[str, Any]] = []
        self.statuses = statuses
        self.port = port or free_port()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                first = not any(d["headers"]["webhook-id"] == headers["webhook-id"] for d in receiver.deliveries)
                receiver.deliveries.append({"headers": headers, "body": body})
                if receiver.statuses is not None:
                    status = receiver.statuses[min(len(receiver.deliveries), len(receiver.statuses)) - 1]
                else:
                    status = 500 if first else 204
                self.send_response(status)
                if status in (301, 302, 307):
                    self.send_header("Location", receiver.url)
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def queue_delivery(redis: redis_py.Redis, settings: Settings, url: str) -> str:
    """A job with a webhook, ended by a cancel, which queues its first delivery as every end does."""
    queues = QueueCache(redis)
    job = enqueue_job(queues, settings, Submission("m", b"x", "application/octet-stream", webhook=url))
    cancel_job(queues, settings, job.id)
    assert redis.llen(f"rq:queue:{keys.WEBHOOK_QUEUE}") >= 1
    return job.id


def attempts(redis: redis_py.Redis, job_id: str) -> list[dict[str, Any]]:
    """The recorded attempts, without their timestamps."""
    recorded = get_job_view(redis, job_id)["webhook"]["attempts"]
    return [{k: v for k, v in attempt.items() if k != "at"} for attempt in recorded]
