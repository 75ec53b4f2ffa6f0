"""A local webhook receiver for end-to-end tests: real HTTP, every delivery recorded with its headers."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from shared.redis_server import free_port


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
