"""The API's HTTP protocol on the wire: each answer of a real API process reaches the client in one segment."""

from __future__ import annotations

import socket
import struct
import sys
from pathlib import Path

import pytest

from tests.support.models import ROOT
from tests.support.stack import new_stack, serving

DIGIT = (ROOT / "samples" / "digit.png").read_bytes()
# struct tcp_info (linux/tcp.h, append-only): tcpi_data_segs_in, the segments that carried data, since Linux 4.6.
TCP_INFO_DATA_SEGS_IN = 152


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
