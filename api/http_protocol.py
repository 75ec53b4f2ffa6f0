"""The API's HTTP protocol: uvicorn's own, with a response's head and body leaving in one send.

uvicorn writes a response's status line and headers when the app starts the response, and the body
in a second write: two ``send()`` calls and two TCP segments for one answer (strace of a submit:
199 bytes, then 333), so the client wakes twice for it. With two API processes on two cores beside
Redis and the load generator, those extra wake-ups preempted the API (about one involuntary context
switch per submit where one process had none), and each cost the client a second read.

Here a write is held until the next one, which takes it along: a response's head leaves with its
body. What has no follower in the same turn of the event loop (a streamed response's head before
its first event, an event itself) leaves at the end of that turn, so nothing waits on a later write.
Written here because uvicorn has no option for it; the protocol is uvicorn's class, given its
transport through this wrapper, and uvicorn's ``http=`` setting takes the class.
"""

from __future__ import annotations

import asyncio
from typing import Any

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _UvicornProtocol
except ImportError:  # no httptools wheel for this platform: uvicorn's pure-Python parser
    from uvicorn.protocols.http.h11_impl import H11Protocol as _UvicornProtocol  # type: ignore[assignment]


class JoiningTransport(asyncio.Transport):
    """A transport whose writes leave in pairs: each held until the next write or the loop's next turn."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush_handle: asyncio.Handle | None = None
        # What the tests count: the sends this connection made.
        self.sends = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._held is None:
            self._held = bytes(data)
            self._flush_handle = self._loop.call_soon(self._flush)
            return
        held, self._held = self._held, None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._send(held + data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def _flush(self) -> None:
        self._flush_handle = None
        held, self._held = self._held, None
        # A connection the client closed meanwhile has nobody left to read it.
        if held is not None and not self._transport.is_closing():
            self._send(held)

    def _send(self, data: bytes) -> None:
        self.sends += 1
        self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._transport.abort()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class HttpProtocol(_UvicornProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools where installed, else h11) over a ``JoiningTransport``."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(JoiningTransport(transport, self.loop))  # type: ignore[arg-type]
