"""The API's HTTP protocol: each answer leaves in one send, and nothing written waits for a later write."""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from api.http_protocol import JoiningTransport
from tests.stack import ROOT, new_stack, serving

DIGIT = (ROOT / "samples" / "digit.png").read_bytes()
# struct tcp_info (linux/tcp.h, append-only): tcpi_data_segs_in, the segments that carried data, since Linux 4.6.
TCP_INFO_DATA_SEGS_IN = 152


class Recorder(asyncio.Transport):
    """The socket's side of a transport: what was sent, in which sends, and whether it closed."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: Any) -> None:
        self.sent.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_write_buffer_size(self) -> int:
        return 0


def _joined(body: Any) -> tuple[JoiningTransport, Recorder, list[bytes]]:
    """Runs ``body(transport)`` in a loop turn, then one more turn; returns what was sent after the first."""

    async def run() -> tuple[JoiningTransport, Recorder, list[bytes]]:
        inner = Recorder()
        transport = JoiningTransport(inner, asyncio.get_running_loop())
        body(transport)
        during = list(inner.sent)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return transport, inner, during

    return asyncio.run(run())


def test_a_head_and_its_body_leave_together_as_the_body_is_written() -> None:
    def respond(transport: JoiningTransport) -> None:
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        transport.write(b"{}")

    transport, inner, during = _joined(respond)
    # Sent at the body's write, not at the end of the turn: no answer waits on the loop.
    assert during == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    assert inner.sent == during and transport.sends == 1


def test_a_write_with_no_follower_leaves_at_the_end_of_the_loop_turn() -> None:
    def stream(transport: JoiningTransport) -> None:
        transport.write(b"head")
        assert transport.get_write_buffer_size() == 4

    transport, inner, during = _joined(stream)
    assert during == []
    assert inner.sent == [b"head"]
    assert transport.get_write_buffer_size() == 0


def test_three_writes_in_a_turn_leave_in_order_in_two_sends() -> None:
    def three(transport: JoiningTransport) -> None:
        transport.write(b"a")
        transport.write(bytearray(b"b"))
        transport.write(memoryview(b"c"))
        transport.write(b"")

    transport, inner, _ = _joined(three)
    assert inner.sent == [b"ab", b"c"] and transport.sends == 2


def test_close_sends_what_is_held_first_and_abort_drops_it() -> None:
    def close(transport: JoiningTransport) -> None:
        transport.write(b"last words")
        transport.close()

    _, closed, during = _joined(close)
    assert during == [b"last words"] and closed.closed

    def abort(transport: JoiningTransport) -> None:
        transport.write(b"never sent")
        transport.abort()

    _, aborted, _ = _joined(abort)
    assert aborted.sent == [] and aborted.aborted


def test_a_held_write_is_dropped_when_the_connection_closed_before_it_left() -> None:
    def gone(transport: JoiningTransport) -> None:
        transport.write(b"for nobody")
        inner = transport._transport
        assert isinstance(inner, Recorder)
        inner.closed = True  # the client went away within the turn

    _, inner, _ = _joined(gone)
    assert inner.sent == []


def _data_segments_in(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("I", info, TCP_INFO_DATA_SEGS_IN)[0])


def _read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the API closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


@pytest.mark.e2e
@pytest.mark.skipif(sys.platform != "linux", reason="counts segments with Linux's TCP_INFO")
def test_each_answer_of_the_api_reaches_the_client_in_one_segment(tmp_path: Path) -> None:
    """uvicorn's own protocol sends the head and the body apart: two segments, and the client woken twice."""
    requests = [
        (b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n", b"200"),
        (
            b"POST /v1/models/digits/jobs HTTP/1.1\r\nhost: t\r\ncontent-type: image/png\r\n"
            + b"content-length: %d\r\n\r\n" % len(DIGIT)
            + DIGIT,
            b"202",
        ),
        (b"GET /v1/jobs/no-such-job HTTP/1.1\r\nhost: t\r\n\r\n", b"404"),
        (b"GET /v1/models HTTP/1.1\r\nhost: t\r\n\r\n", b"200"),
    ]
    with serving(new_stack(tmp_path)) as stack:
        stack.start_api()
        with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
            for request, status in requests:
                before = _data_segments_in(sock)
                sock.sendall(request)
                head, body = _read_answer(sock)
                assert head.split(b" ")[1] == status, head
                assert body.startswith(b"{") and body.endswith(b"}")
                assert _data_segments_in(sock) - before == 1, head.split(b"\r\n")[0]
