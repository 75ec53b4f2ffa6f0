"""The API's HTTP protocol: each answer leaves in one send, and nothing written waits for a later write."""

from __future__ import annotations

import asyncio
from typing import Any

from inferq.api.http_protocol import JoiningTransport


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
