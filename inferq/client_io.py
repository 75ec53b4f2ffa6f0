"""The two drivers of the SDK's flows (``inferq.client_flows``): httpx.Client with time.sleep for ``Client``,
httpx.AsyncClient with asyncio.sleep for ``AsyncClient``. They only do what a flow asks; every decision is there."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, TypeVar

import httpx

from inferq.client_flows import Base, Effect, Emit, Feed, Flow, Open, Send, Sleep, advance, returning
from inferq.client_http import Call

T = TypeVar("T")
R = TypeVar("R")


def request_kwargs(base: Base, call: Call) -> dict[str, Any]:
    """httpx's arguments for ``call``, but its method, path and files; its timeout on top of the client's."""
    return {
        "params": call.params,
        "headers": base._headers | call.headers,
        "json": call.json,
        "data": call.data,
        "content": call.content,
        "timeout": base.timeout + (call.timeout_s or 0),
    }


def stream_kwargs(base: Base, effect: Open) -> dict[str, Any]:
    return {"params": effect.call.params, "headers": base._headers | effect.call.headers, "timeout": effect.timeout}


class _Stream:
    """The one stream a flow holds open; a new one, an error, its end or the flow's end closes it."""

    def __init__(self, http: httpx.Client) -> None:
        self._http = http
        self._held = contextlib.ExitStack()
        self._lines: Iterator[str] = iter(())

    def open(self, base: Base, effect: Open) -> httpx.Response:
        self.close()
        opening = self._http.stream(effect.call.method, effect.call.path, **stream_kwargs(base, effect))
        response = self._held.enter_context(opening)
        if response.status_code >= 400:
            response.read()  # the error body, for the flow to raise
            self.close()
        else:
            self._lines = response.iter_lines()
        return response

    def read_line(self) -> str | None:
        line = next(self._lines, None)
        if line is None:
            self.close()
        return line

    def close(self) -> None:
        self._lines = iter(())
        self._held.close()


class SyncIO(Base):
    """Drives flows with httpx.Client and time.sleep."""

    _http: httpx.Client

    def _run(self, flow: Flow[R]) -> R:
        (value,) = self._iterate(returning(flow))
        return value

    def _iterate(self, feed: Feed[T]) -> Iterator[T]:
        with contextlib.closing(feed), contextlib.closing(_Stream(self._http)) as stream:
            outcome: Any = None
            error: httpx.TransportError | None = None
            while (effect := advance(feed, outcome, error)) is not None:
                outcome, error = None, None
                if isinstance(effect, Emit):
                    yield effect.item
                    continue
                try:
                    outcome = self._perform(effect, stream)
                except httpx.TransportError as exc:
                    stream.close()
                    error = exc

    def _perform(self, effect: Effect, stream: _Stream) -> Any:
        if isinstance(effect, Send):
            call = effect.call
            return self._http.request(call.method, call.path, files=call.files, **request_kwargs(self, call))
        if isinstance(effect, Sleep):
            time.sleep(effect.seconds)
            return None
        if isinstance(effect, Open):
            return stream.open(self, effect)
        return stream.read_line()


class _AsyncStream:
    """As ``_Stream``, for httpx.AsyncClient."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http
        self._held = contextlib.AsyncExitStack()
        self._lines: AsyncIterator[str] | None = None

    async def open(self, base: Base, effect: Open) -> httpx.Response:
        await self.aclose()
        opening = self._http.stream(effect.call.method, effect.call.path, **stream_kwargs(base, effect))
        response = await self._held.enter_async_context(opening)
        if response.status_code >= 400:
            await response.aread()
            await self.aclose()
        else:
            self._lines = response.aiter_lines()
        return response

    async def read_line(self) -> str | None:
        line = await anext(self._lines, None) if self._lines is not None else None
        if line is None:
            await self.aclose()
        return line

    async def aclose(self) -> None:
        self._lines = None
        await self._held.aclose()


class AsyncIO(Base):
    """Drives flows with httpx.AsyncClient and asyncio.sleep."""

    _http: httpx.AsyncClient

    async def _run(self, flow: Flow[R]) -> R:
        [value] = [item async for item in self._iterate(returning(flow))]
        return value

    async def _iterate(self, feed: Feed[T]) -> AsyncGenerator[T, None]:
        with contextlib.closing(feed):
            async with contextlib.aclosing(_AsyncStream(self._http)) as stream:
                outcome: Any = None
                error: httpx.TransportError | None = None
                while (effect := advance(feed, outcome, error)) is not None:
                    outcome, error = None, None
                    if isinstance(effect, Emit):
                        yield effect.item
                        continue
                    try:
                        outcome = await self._perform(effect, stream)
                    except httpx.TransportError as exc:
                        await stream.aclose()
                        error = exc

    async def _perform(self, effect: Effect, stream: _AsyncStream) -> Any:
        if isinstance(effect, Send):
            call = effect.call
            return await self._http.request(call.method, call.path, files=call.files, **request_kwargs(self, call))
        if isinstance(effect, Sleep):
            await asyncio.sleep(effect.seconds)
            return None
        if isinstance(effect, Open):
            return await stream.open(self, effect)
        return await stream.read_line()
