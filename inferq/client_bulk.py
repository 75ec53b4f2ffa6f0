"""The SDK's bulk helpers, the same for ``Client`` and ``AsyncClient``: upload a batch, read it, read or follow its
result lines (resuming by offset), cancel it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from inferq.client_http import Base, Call, batch_call, batch_path, raise_for
from inferq.client_types import Batch, BatchResult, TransportError

POLL_S = 0.5


def _results_call(batch_id: str, offset: int) -> Call:
    # Never filtered by the API (?status=): the offset counts every line, so a read cut off resumes exactly.
    return Call("GET", batch_path(batch_id, "/results"), params={"offset": offset})


def _line(raw: str, status: str | None) -> BatchResult | None:
    """The result line, or None for a blank line or one of another status than asked for."""
    if not raw.strip():
        return None
    line = BatchResult.from_dict(json.loads(raw))
    return line if status is None or line.status == status else None


class BulkMethods(Base):
    """``Client``'s bulk helpers."""

    _http: httpx.Client

    def _send(self, call: Call) -> httpx.Response:
        raise NotImplementedError

    def create_batch(
        self,
        model: str,
        items: Any,
        *,
        priority: str | None = None,
        webhook: str | None = None,
        result_ttl: int | None = None,
        idempotency_key: str | None = None,
    ) -> Batch:
        """Upload a bulk batch for ``model`` and return it at once (queued), with the lines the API refused.

        ``items`` is the path of a JSONL file, or an iterable of lines: mappings such as
        ``{"custom_id": "a", "inputs": [1, 2]}`` (or ``"image": <base64>``), or their JSON as str or bytes.
        ``priority`` is "bulk" (the API's default) or "interactive". Without ``idempotency_key`` one is made, so
        a retried upload makes one batch. ``InvalidInput`` if no line is a valid item.
        """
        options = {"priority": priority, "webhook": webhook, "result_ttl": result_ttl}
        options["idempotency_key"] = idempotency_key
        return Batch.from_dict(self._send(batch_call(model, items, options)).json())

    def get_batch(self, batch_id: str) -> Batch:
        """The batch as it is now: status, counts, rate; ``NotFound`` if unknown or its results expired."""
        return Batch.from_dict(self._send(Call("GET", batch_path(batch_id))).json())

    def cancel_batch(self, batch_id: str) -> Batch:
        """Cancel the items not yet run (lines already written stay); ``Conflict`` if the batch already ended."""
        return Batch.from_dict(self._send(Call("POST", batch_path(batch_id, "/cancel"), repeatable=False)).json())

    def batch_results(
        self, batch_id: str, *, offset: int = 0, status: str | None = None, follow: bool = False
    ) -> Iterator[BatchResult]:
        """The batch's result lines from line ``offset`` on, in the order items ended.

        Without ``follow``: the lines written so far. With it: every line, waiting for new ones until the batch
        has ended. To resume later, pass as ``offset`` how many lines were read (of every status: ``status``
        only filters what is yielded). A read cut off is resumed where it stopped, never repeating a line.
        """
        attempt = 0
        while True:
            ended = follow and self.get_batch(batch_id).done  # before reading: that read then holds every line
            before = offset
            call = _results_call(batch_id, offset)
            try:
                with self._http.stream("GET", call.path, **self._stream_kwargs(call)) as response:
                    if response.status_code >= 400:
                        response.read()
                        attempt += 1
                        delay = self._delay(call, attempt, response)
                        if delay is None:
                            raise_for(response)
                        time.sleep(delay or 0)
                        continue
                    for raw in response.iter_lines():
                        line = _line(raw, status)
                        offset += bool(raw.strip())
                        attempt = 0
                        if line is not None:
                            yield line
            except httpx.TransportError as exc:
                attempt += 1
                delay = self._delay(call, attempt, exc)
                if delay is None:
                    raise TransportError(f"results of batch {batch_id}: {exc!r}") from exc
                time.sleep(delay)
                continue
            if not follow or ended:
                return
            if offset == before:
                time.sleep(POLL_S)


class AsyncBulkMethods(Base):
    """``AsyncClient``'s bulk helpers: as ``Client``'s, awaited; ``batch_results`` is an async iterator."""

    _http: httpx.AsyncClient

    async def _send(self, call: Call) -> httpx.Response:
        raise NotImplementedError

    async def create_batch(
        self,
        model: str,
        items: Any,
        *,
        priority: str | None = None,
        webhook: str | None = None,
        result_ttl: int | None = None,
        idempotency_key: str | None = None,
    ) -> Batch:
        """Upload a bulk batch for ``model``; as ``Client.create_batch``."""
        options = {"priority": priority, "webhook": webhook, "result_ttl": result_ttl}
        options["idempotency_key"] = idempotency_key
        return Batch.from_dict((await self._send(batch_call(model, items, options))).json())

    async def get_batch(self, batch_id: str) -> Batch:
        """The batch as it is now; as ``Client.get_batch``."""
        return Batch.from_dict((await self._send(Call("GET", batch_path(batch_id)))).json())

    async def cancel_batch(self, batch_id: str) -> Batch:
        """Cancel the items not yet run; as ``Client.cancel_batch``."""
        call = Call("POST", batch_path(batch_id, "/cancel"), repeatable=False)
        return Batch.from_dict((await self._send(call)).json())

    async def batch_results(
        self, batch_id: str, *, offset: int = 0, status: str | None = None, follow: bool = False
    ) -> AsyncIterator[BatchResult]:
        """The batch's result lines from line ``offset`` on; as ``Client.batch_results``."""
        attempt = 0
        while True:
            ended = follow and (await self.get_batch(batch_id)).done
            before = offset
            call = _results_call(batch_id, offset)
            try:
                async with self._http.stream("GET", call.path, **self._stream_kwargs(call)) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        attempt += 1
                        delay = self._delay(call, attempt, response)
                        if delay is None:
                            raise_for(response)
                        await asyncio.sleep(delay or 0)
                        continue
                    async for raw in response.aiter_lines():
                        line = _line(raw, status)
                        offset += bool(raw.strip())
                        attempt = 0
                        if line is not None:
                            yield line
            except httpx.TransportError as exc:
                attempt += 1
                delay = self._delay(call, attempt, exc)
                if delay is None:
                    raise TransportError(f"results of batch {batch_id}: {exc!r}") from exc
                await asyncio.sleep(delay)
                continue
            if not follow or ended:
                return
            if offset == before:
                await asyncio.sleep(POLL_S)
