"""The API's Redis client: commands from concurrent requests leave together, as one pipeline.

Each ``redis.asyncio`` command costs Python work around its socket write and read: taking a pooled
connection, a retry wrapper, a syscall each way. Under load that was a fifth of a submit. Here a
command joins the batch being gathered; one task sends the batch as a non-transactional pipeline
(one write, one read for all) and hands each request its own reply, while the next batch gathers.
An idle API sends each command at once, alone: nothing waits for a batch to fill.

Each reply is the command's own, errors included (a full queue's script error reaches only its
request); a lost connection fails the batch it was in. A batch runs on one pooled connection, so
however many requests wait, the API holds few Redis connections. Blocking commands (BLPOP and the
like) would hold every request behind them: the API never sends one on this client.

Written here because redis-py has no automatic pipelining (ioredis's ``enableAutoPipelining`` is
the same idea); it is a subclass overriding the one method every command goes through.

Its connections pack commands with hiredis, as redis-py's synchronous client already does: the
asyncio connection packs them in Python, a tenth of a submit's time for ENQUEUE's sixty arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

Pending = tuple[tuple[Any, ...], Mapping[str, Any], "asyncio.Future[Any]"]


class AutoPipelinedRedis(Redis):
    """A ``redis.asyncio.Redis`` whose commands, sent concurrently, share pipelines."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pool = self.connection_pool
        if HIREDIS_AVAILABLE and not issubclass(pool.connection_class, _HiredisPacking):
            # A subclass of the URL's own class (TCP, TLS or Unix socket), for connections made from now on.
            base = pool.connection_class
            pool.connection_class = type(f"Hiredis{base.__name__}", (_HiredisPacking, base), {})
        self._pending: list[Pending] = []
        self._sender: asyncio.Task[None] | None = None
        # How many pipelines carried how many commands: what the tests and the benchmark count.
        self.batches = 0
        self.commands = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        return await self._join(args, options)

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        """A non-transactional pipeline's commands join the batch too; a transaction keeps its own connection."""
        if transaction:
            return super().pipeline(transaction, shard_hint)
        return _JoiningPipeline(self)

    def _join(self, args: tuple[Any, ...], options: Mapping[str, Any]) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((args, options, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send(), name="inferq-redis-pipeline")
        return future

    async def _send(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            self.batches += 1
            self.commands += len(batch)
            try:
                async with Pipeline(self.connection_pool, self.response_callbacks, False, None) as pipe:
                    for args, options, _ in batch:
                        pipe.pipeline_execute_command(*args, **options)
                    replies: list[Any] = await pipe.execute(raise_on_error=False)
            except asyncio.CancelledError:
                for _, _, future in batch:
                    future.cancel()
                raise
            except Exception as exc:
                replies = [exc] * len(batch)
            for (_, _, future), reply in zip(batch, replies, strict=True):
                if future.done():  # its request went away (the client disconnected)
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        for _, _, future in self._pending:
            future.cancel()
        self._pending.clear()
        await super().aclose(close_connection_pool)


class _HiredisPacking:
    """Packs commands with hiredis (byte for byte what redis-py's Python packer writes)."""

    _serializer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        return self._serializer.pack(*args)  # type: ignore[no-any-return]


class _JoiningPipeline(Pipeline):
    """A pipeline whose commands go out in the client's next batch, in order, next to each other."""

    def __init__(self, client: AutoPipelinedRedis) -> None:
        super().__init__(client.connection_pool, client.response_callbacks, False, None)
        self._client = client

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack, self.command_stack = self.command_stack, []
        futures = [self._client._join(args, options) for args, options in stack]
        replies = list(await asyncio.gather(*futures, return_exceptions=True))
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
        return replies
