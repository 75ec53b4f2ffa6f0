"""The benchmark's load generators (bench/generators.py): hey, wrk and the asyncio one, each run for real
against a tiny local HTTP server, and their output read back into the same counts."""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.generators import LoadResult, hammer, limited, parse_hey, parse_wrk, pick_tool

BODY = b'{"inputs": [1, 2, 3, 4]}'


class Tiny(BaseHTTPRequestHandler):
    """GET /ok answers 200, GET /busy 503; POST /submit answers 202 if it got BODY as JSON with the header."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the generators use it
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._count("get")
        self._answer(200 if self.path == "/ok" else 503)

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        good = (
            body == BODY
            and self.headers.get("content-type") == "application/json"
            and self.headers.get("prefer") == "wait=5"
        )
        self._count("post" if good else "bad post")
        self._answer(202 if good else 400)

    def _count(self, what: str) -> None:
        with self.lock:
            self.seen[what] += 1

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Tiny.seen = Counter()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Tiny)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _tools() -> list[object]:
    return [
        pytest.param(tool, marks=pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} is not installed"))
        for tool in ("hey", "wrk")
    ] + ["python"]


@pytest.mark.parametrize("tool", _tools())
def test_a_real_run_is_read_back_into_counts_and_percentiles(server: str, tool: str) -> None:
    got = hammer(f"{server}/ok", 4, 1.0, tool=tool)
    assert got.tool == tool and got.clients == 4
    assert got.ok > 0 and got.failed == 0
    assert Tiny.seen["get"] >= got.ok  # wrk leaves out what was in flight when its time was up
    assert got.p50_ms is not None and got.p99_ms is not None and got.p50_ms <= got.p99_ms
    assert got.duration_s > 0 and got.per_s == got.ok / got.duration_s


@pytest.mark.parametrize("tool", _tools())
def test_a_post_carries_its_body_and_headers(server: str, tool: str) -> None:
    headers = {"content-type": "application/json", "prefer": "wait=5"}
    got = hammer(f"{server}/submit", 2, 1.0, method="POST", body=BODY, headers=headers, tool=tool)
    assert Tiny.seen["bad post"] == 0
    assert got.ok > 0 and got.failed == 0 and Tiny.seen["post"] >= got.ok


@pytest.mark.parametrize("tool", _tools())
def test_error_answers_and_refused_connections_count_as_failed(server: str, tool: str) -> None:
    busy = hammer(f"{server}/busy", 2, 1.0, tool=tool)
    assert busy.ok == 0 and busy.failed > 0
    port = server.rsplit(":", 1)[1]
    refused = hammer(f"http://127.0.0.1:{int(port) + 1 if int(port) < 65535 else 1}/ok", 2, 1.0, tool=tool)
    assert refused.ok == 0


def test_hey_summary_is_parsed() -> None:
    text = """
Summary:
  Total:\t8.0051 secs
  Slowest:\t0.0611 secs
  Requests/sec:\t6737.4

Latency distribution:
  10%% in 0.0041 secs
  50%% in 0.0090 secs
  90%% in 0.0150 secs
  99%% in 0.0268 secs

Status code distribution:
  [202]\t53900 responses
  [429]\t52 responses

Error distribution:
  [3]\tPost "http://127.0.0.1:1/x": dial tcp: connection refused
""".replace("%%", "%")
    got = parse_hey(text, 64)
    assert got == LoadResult(
        "hey",
        64,
        8.0051,
        53900,
        55,
        9.0,
        15.0,
        26.8,
        {"202": 53900, "429": 52},
        {'Post "http://127.0.0.1:1/x": dial tcp: connection refused': 3},
    )


def test_wrk_summary_line_is_parsed() -> None:
    line = (
        'INFERQ-WRK {"duration_us": 2000000, "requests": 1000, "connect": 0, "read": 1, "write": 0, '
        '"status": 10, "timeout": 2, "p50_us": 1500, "p90_us": 3000, "p99_us": 9000}'
    )
    got = parse_wrk(f"Running 2s test\n{line}\n", 8)
    assert (got.ok, got.failed, got.duration_s, got.p50_ms, got.p99_ms) == (990, 13, 2.0, 1.5, 9.0)
    assert got.errors == {"read": 1, "status": 10, "timeout": 2}


def test_a_figure_near_the_generators_ceiling_is_marked_limited() -> None:
    assert limited(950, 1000) and not limited(800, 1000)
    assert limited(480, 1000, calls_per_item=2)  # two calls per item: 960 calls/s
    with pytest.raises(ValueError, match="unknown load generator"):
        pick_tool("ab")


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_wrk_sends_a_mix_of_bodies_each_in_turn(server: str) -> None:
    """bench.vs_litserve's texts: each request the next body, so every one of them is sent."""
    bodies = [b'{"inputs": [%d]}' % i for i in range(5)]
    seen: Counter[bytes] = Counter()
    real = Tiny.do_POST

    def record(handler: Tiny) -> None:
        body = handler.rfile.read(int(handler.headers.get("content-length", "0")))
        with Tiny.lock:
            seen[body] += 1
        handler._answer(202)

    Tiny.do_POST = record  # type: ignore[method-assign]
    try:
        got = hammer(f"{server}/submit", 2, 1.0, method="POST", bodies=bodies, tool="wrk")
    finally:
        Tiny.do_POST = real  # type: ignore[method-assign]
    assert got.ok > 0 and got.failed == 0
    assert set(seen) == set(bodies)
    assert max(seen.values()) - min(seen.values()) <= 2  # in turn: each thread's share of the mix stays even


def test_a_mix_of_bodies_needs_wrk(server: str) -> None:
    with pytest.raises(ValueError, match="wrk"):
        hammer(f"{server}/submit", 2, 1.0, method="POST", bodies=[BODY, BODY], tool="python")
