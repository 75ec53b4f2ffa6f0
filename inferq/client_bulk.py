"""The SDK's bulk helpers, as thin methods of ``Client`` and ``AsyncClient`` over the flows in
``inferq.client_flows``: upload a batch, read it, read or follow its result lines (resuming by offset), cancel it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from inferq import client_flows as flows
from inferq.client_io import AsyncIO, SyncIO
from inferq.client_types import Batch, BatchResult


class BulkMethods(SyncIO):
    """``Client``'s bulk helpers."""

    def create_batch(
        self,
        model: str,
        items: Any,
        *,
        priority: str | None = None,
        webhook: str | None = None,
        result_ttl: int | None = None,
        idempotency_key: str | None = None,
        version: int | None = None,
    ) -> Batch:
        """Upload a bulk batch for ``model`` and return it at once (queued), with the lines the API refused.

        ``items`` is the path of a JSONL file, or an iterable of lines: mappings such as
        ``{"custom_id": "a", "inputs": [1, 2]}`` (or ``"image": <base64>``), or their JSON as str or bytes.
        ``priority`` is "bulk" (the API's default) or "interactive". Without ``idempotency_key`` one is made, so
        a retried upload makes one batch. ``version`` pins the model's version every item runs on (else the
        model's traffic shares route the batch). ``InvalidInput`` if no line is a valid item.
        """
        options = {"priority": priority, "webhook": webhook, "result_ttl": result_ttl, "version": version}
        options["idempotency_key"] = idempotency_key
        return self._run(flows.create_batch(self, model, items, options))

    def get_batch(self, batch_id: str) -> Batch:
        """The batch as it is now: status, counts, rate; ``NotFound`` if unknown or its results expired."""
        return self._run(flows.get_batch(self, batch_id))

    def cancel_batch(self, batch_id: str) -> Batch:
        """Cancel the items not yet run (lines already written stay); ``Conflict`` if the batch already ended."""
        return self._run(flows.cancel_batch(self, batch_id))

    def batch_results(
        self, batch_id: str, *, offset: int = 0, status: str | None = None, follow: bool = False
    ) -> Iterator[BatchResult]:
        """The batch's result lines from line ``offset`` on, in the order items ended.

        Without ``follow``: the lines written so far. With it: every line, waiting for new ones until the batch
        has ended. To resume later, pass as ``offset`` how many lines were read (of every status: ``status``
        only filters what is yielded). A read cut off is resumed where it stopped, never repeating a line.
        """
        yield from self._iterate(flows.batch_results(self, batch_id, offset, status, follow))


class AsyncBulkMethods(AsyncIO):
    """``AsyncClient``'s bulk helpers: as ``Client``'s, awaited; ``batch_results`` is an async iterator."""

    async def create_batch(
        self,
        model: str,
        items: Any,
        *,
        priority: str | None = None,
        webhook: str | None = None,
        result_ttl: int | None = None,
        idempotency_key: str | None = None,
        version: int | None = None,
    ) -> Batch:
        """Upload a bulk batch for ``model``; as ``Client.create_batch``."""
        options = {"priority": priority, "webhook": webhook, "result_ttl": result_ttl, "version": version}
        options["idempotency_key"] = idempotency_key
        return await self._run(flows.create_batch(self, model, items, options))

    async def get_batch(self, batch_id: str) -> Batch:
        """The batch as it is now; as ``Client.get_batch``."""
        return await self._run(flows.get_batch(self, batch_id))

    async def cancel_batch(self, batch_id: str) -> Batch:
        """Cancel the items not yet run; as ``Client.cancel_batch``."""
        return await self._run(flows.cancel_batch(self, batch_id))

    async def batch_results(
        self, batch_id: str, *, offset: int = 0, status: str | None = None, follow: bool = False
    ) -> AsyncIterator[BatchResult]:
        """The batch's result lines from line ``offset`` on; as ``Client.batch_results``."""
        feed = flows.batch_results(self, batch_id, offset, status, follow)
        async with contextlib.aclosing(self._iterate(feed)) as lines:
            async for line in lines:
                yield line
