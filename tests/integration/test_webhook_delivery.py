"""Webhook delivery against hostile receivers: dripping, huge, DNS-rebinding.

Each attempt runs in a real RQ worker (in-process, burst) against a real redis-server; receivers
are real sockets on loopback. A sender killed mid-attempt: tests/e2e/test_e2e_webhook_sender.py.
"""

from __future__ import annotations

import functools
import shutil
import socket
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from rq.scheduler import RQScheduler

from inferq.shared.redis_server import free_port
from inferq.shared.settings import Settings, get_settings
from inferq.workers import outage
from inferq.workers.webhooks import webhook_worker
from tests.support.webhooks import Receiver, attempts, queue_delivery

TIMEOUT_S = 1
DRIP_INTERVAL_S = 0.2
DRIP_BYTES = 50  # 10 s of dripping: far past the 1 s deadline
HUGE_BYTES = 64 * 1024 * 1024
RESPONSE_BYTES_MAX = 4096  # what the sender reads of an answer at most


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> Settings:
    """The sender's settings (deliver() reads the environment's, as in production)."""
    env = {
        "INFERQ_REDIS_URL": redis_url,
        "INFERQ_WEBHOOK_TIMEOUT_S": str(TIMEOUT_S),
        "INFERQ_WEBHOOK_RETRY_DELAYS_S": "[5]",
        "INFERQ_WEBHOOK_ALLOW": "127.0.0.1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    return get_settings()


def deliver_queued(redis: redis_py.Redis, settings: Settings) -> float:
    """Run the sender until the webhooks queue is empty; the seconds it took."""
    started = time.monotonic()
    webhook_worker(redis, settings).work(burst=True)
    return time.monotonic() - started


class RawReceiver:
    """A TCP server on loopback that reads one request per connection and answers with ``respond``."""

    def __init__(self, respond: Any) -> None:
        self.respond = respond
        self.sent = 0
        self.requests = 0
        self.peer_closed = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            if not _read_request(conn):
                return
            self.requests += 1
            try:
                self.respond(self, conn)
            except OSError:
                self.peer_closed.set()

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def close(self) -> None:
        self.listener.close()


def _read_request(conn: socket.socket) -> bool:
    """Read one request with a Content-Length body; False if the peer hung up first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return False
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
    while len(body) < int(fields.get(b"content-length", b"0")):
        chunk = conn.recv(65536)
        if not chunk:
            return False
        body += chunk
    return True


def drip_headers(receiver: RawReceiver, conn: socket.socket) -> None:
    receiver.send(conn, b"HTTP/1.1 200 OK\r\nX-Slow: ")
    for _ in range(DRIP_BYTES):
        time.sleep(DRIP_INTERVAL_S)
        receiver.send(conn, b"x")
    receiver.send(conn, b"\r\nContent-Length: 0\r\n\r\n")


def drip_body(receiver: RawReceiver, conn: socket.socket) -> None:
    receiver.send(conn, f"HTTP/1.1 200 OK\r\nContent-Length: {DRIP_BYTES}\r\n\r\n".encode())
    for _ in range(DRIP_BYTES):
        time.sleep(DRIP_INTERVAL_S)
        receiver.send(conn, b"x")


def huge_body(receiver: RawReceiver, conn: socket.socket) -> None:
    receiver.send(conn, f"HTTP/1.1 200 OK\r\nContent-Length: {HUGE_BYTES}\r\n\r\n".encode())
    chunk = b"\0" * 65536
    for _ in range(HUGE_BYTES // len(chunk)):
        receiver.send(conn, chunk)


@pytest.mark.parametrize("respond", [drip_headers, drip_body], ids=["headers", "body"])
def test_a_dripping_receiver_fails_the_attempt_at_the_total_deadline(
    redis: redis_py.Redis, settings: Settings, respond: Any
) -> None:
    receiver = RawReceiver(respond)
    try:
        job_id = queue_delivery(redis, settings, receiver.url)
        took_s = deliver_queued(redis, settings)
        assert attempts(redis, job_id) == [
            {
                "attempt": 1,
                "error": f"timed out: no complete answer within {TIMEOUT_S} s",
                "next_attempt_in_s": 5.0,
                "outcome": "retrying",
            }
        ]
        # The sender hung up on the receiver well before its 50 drips were through.
        assert receiver.peer_closed.wait(5)
        assert receiver.requests == 1
        assert took_s < TIMEOUT_S + 4
    finally:
        receiver.close()


def test_a_huge_response_is_read_only_up_to_the_cap(redis: redis_py.Redis, settings: Settings) -> None:
    receiver = RawReceiver(huge_body)
    try:
        job_id = queue_delivery(redis, settings, receiver.url)
        deliver_queued(redis, settings)
        assert attempts(redis, job_id) == [
            {"attempt": 1, "status_code": 200, "response_bytes": RESPONSE_BYTES_MAX, "outcome": "delivered"}
        ]
        # The sender closed the connection after the cap: the rest of the 64 MiB was never sent
        # (what the kernel's socket buffers took is all that left the receiver).
        assert receiver.peer_closed.wait(5)
        assert receiver.sent < 16 * 1024 * 1024
    finally:
        receiver.close()


class HookServer:
    """An HTTP receiver on one loopback address that answers 204 and keeps each request's Host header."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.hosts: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                server.hosts.append(self.headers["host"])
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer((host, port), Handler)
        if tls is not None:
            self.http.socket = tls.wrap_socket(self.http.socket, server_side=True)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def test_delivery_connects_to_the_address_it_checked_not_a_rebound_one(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 127.0.0.2 stands for the public address the name had when it was checked (allowed here so
    # no packet leaves the machine); 127.0.0.1 is the loopback-only service a rebinding DNS
    # answer points at afterwards.
    monkeypatch.setenv("INFERQ_WEBHOOK_ALLOW", "127.0.0.2/32")
    get_settings.cache_clear()
    port = free_port()
    checked, internal = HookServer("127.0.0.2", port), HookServer("127.0.0.1", port)
    real_getaddrinfo = socket.getaddrinfo
    answers: list[str] = []

    def rebinding_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.test":
            return real_getaddrinfo(host, *args, **kwargs)
        answers.append("127.0.0.2" if not answers else "127.0.0.1")
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (answers[-1], port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding_getaddrinfo)
    try:
        job_id = queue_delivery(redis, get_settings(), f"http://rebind.test:{port}/hook")
        deliver_queued(redis, get_settings())
        assert internal.hosts == []
        assert checked.hosts == [f"rebind.test:{port}"]
        assert answers == ["127.0.0.2"]  # resolved once, at the check
        assert attempts(redis, job_id) == [
            {"attempt": 1, "status_code": 204, "response_bytes": 0, "outcome": "delivered"}
        ]
    finally:
        checked.close()
        internal.close()


def _make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A test CA, and a server certificate it signed for hooks.test: (ca, cert, key)."""
    run = functools.partial(subprocess.run, check=True, capture_output=True, cwd=folder)
    run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem"]
        + ["-days", "1", "-subj", "/CN=inferq test CA", "-addext", "basicConstraints=critical,CA:TRUE"]
    )
    run(
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr"]
        + ["-subj", "/CN=hooks.test"]
    )
    (folder / "ext").write_text("subjectAltName=DNS:hooks.test\n")
    run(
        ["openssl", "x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial"]
        + ["-out", "srv.pem", "-days", "1", "-extfile", "ext"]
    )
    return folder / "ca.pem", folder / "srv.pem", folder / "srv.key"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make certificates")
def test_https_to_a_pinned_address_still_verifies_the_certificate_for_the_name(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ca, cert, key = _make_certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server_names: list[str | None] = []

    def remember_server_name(_sock: Any, name: str | None, _context: Any) -> None:
        server_names.append(name)

    tls.sni_callback = remember_server_name
    server = HookServer("127.0.0.1", 0, tls)
    port = server.http.server_address[1]
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("hooks.test", "impostor.test"):
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))]
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    try:
        good = queue_delivery(redis, settings, f"https://hooks.test:{port}/hook")
        bad = queue_delivery(redis, settings, f"https://impostor.test:{port}/hook")
        deliver_queued(redis, settings)
        assert attempts(redis, good) == [
            {"attempt": 1, "status_code": 204, "response_bytes": 0, "outcome": "delivered"}
        ]
        (refused,) = attempts(redis, bad)
        assert refused["outcome"] == "retrying"
        assert "certificate is not valid for 'impostor.test'" in refused["error"]
        assert server.hosts == [f"hooks.test:{port}"]
        assert server_names == ["hooks.test", "impostor.test"]
    finally:
        server.close()


def test_a_sender_whose_scheduler_start_meets_a_full_redis_goes_on_and_delivers(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ takes its scheduler locks before its loop, outside every outage hook: a CI run's sender came up just as the
    test filled Redis (maxmemory) and quit there with the OOM reply's traceback."""
    receiver = Receiver(statuses=[204])
    real = RQScheduler.acquire_locks
    calls = []

    def full_once(self: RQScheduler, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise redis_py.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
        return real(self, *args, **kwargs)

    try:
        job_id = queue_delivery(redis, settings, receiver.url)
        monkeypatch.setattr(RQScheduler, "acquire_locks", full_once)
        monkeypatch.setattr(outage.time, "sleep", lambda s: None)
        webhook_worker(redis, settings).work(burst=True, with_scheduler=True)
    finally:
        receiver.close()
    assert calls == [1]
    assert [(a["status_code"], a["outcome"]) for a in attempts(redis, job_id)] == [(204, "delivered")]
