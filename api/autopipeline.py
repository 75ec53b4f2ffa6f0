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

Nothing waits for good (``deadline_s``): a command not answered in time raises redis-py's
``TimeoutError`` (the API answers 503), a batch not answered in time drops its connection, which
may be frozen (a NAT or proxy that stopped forwarding), so the next batch goes out on a fresh one,
and a command whose caller gave up before its batch left is never sent. Each command's deadline is kept
by its batch, with no timer of its own: a batch must be answered by the earliest deadline of the commands
in it (a timer per command, asyncio's Timeout, cost a tenth of a submit's CPU in the event loop).

Written here because redis-py has no automatic pipelining (ioredis's ``enableAutoPipelining`` is
the same idea); it is a subclass overriding the one method every command goes through.

Its connections pack commands with hiredis, as redis-py's synchronous client already does: the
asyncio connection packs them in Python, a tenth of a submit's time for ENQUEUE's sixty arguments
(a command with a large argument still goes by Python's packer, which does not copy it:
``shared.connections.Packer``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.utils import HIREDIS_AVAILABLE

from inferq.shared import connections, durability
from inferq.shared.settings import Settings

# A command waiting for its batch: its arguments, options, the future its caller awaits, and its deadline
# (on the loop's clock; None: no deadline).
Pending = tuple[tuple[Any, ...], Mapping[str, Any], "asyncio.Future[Any]", float | None]


class AutoPipelinedRedis(Redis):
    """A ``redis.asyncio.Redis`` whose commands, sent concurrently, share pipelines."""

    def __init__(
        self, *args: Any, deadline_s: float | None = None, settings: Settings | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.deadline_s = deadline_s
        # INFERQ_DURABILITY: a batch holding a write ends with WAIT (or WAITAOF), which confirms every write before
        # it on the batch's connection: one per batch, however many submits it carries (group commit).
        self.settings = settings
        self._confirm = durability.confirm_command(settings) if settings is not None else None
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
        return await self._join(args, options)  # answered by its deadline: its batch keeps it (``_send``)

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        """A non-transactional pipeline's commands join the batch too; a transaction keeps its own connection."""
        if transaction:
            return super().pipeline(transaction, shard_hint)
        return _JoiningPipeline(self)

    def _join(self, args: tuple[Any, ...], options: Mapping[str, Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        deadline = None if self.deadline_s is None else loop.time() + self.deadline_s
        self._pending.append((args, options, future, deadline))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send(), name="inferq-redis-pipeline")
        return future

    async def _send(self) -> None:
        while self._pending:
            # Callers that gave up (their deadline, a client gone) are not sent: a submit answered 503 enqueues nothing.
            batch = [pending for pending in self._pending if not pending[2].done()]
            self._pending = []
            if not batch:
                continue
            self.batches += 1
            self.commands += len(batch)
            try:
                # Answered by the earliest deadline in the batch (a command queued behind a batch that hung waited
                # part of its time already). redis-py drops a connection whose read is cancelled: the next batch
                # takes a fresh one.
                deadlines = [pending[3] for pending in batch if pending[3] is not None]
                async with asyncio.timeout_at(min(deadlines) if deadlines else None):
                    async with Pipeline(self.connection_pool, self.response_callbacks, False, None) as pipe:
                        for args, options, _, _ in batch:
                            pipe.pipeline_execute_command(*args, **options)
                        confirming = self._confirm is not None and any(
                            durability.is_write(args) for args, _, _, _ in batch
                        )
                        if confirming:
                            pipe.pipeline_execute_command(*cast(tuple[Any, ...], self._confirm))
                        replies: list[Any] = await pipe.execute(raise_on_error=False)
                        if confirming:
                            replies = self._confirmed(batch, replies)
            except asyncio.CancelledError:
                for _, _, future, _ in batch:
                    future.cancel()
                raise
            except TimeoutError:
                replies = [RedisTimeoutError(f"Redis did not answer within {self.deadline_s:g} s")] * len(batch)
            except Exception as exc:
                replies = [exc] * len(batch)
            for (_, _, future, _), reply in zip(batch, replies, strict=True):
                if future.done():  # its request went away (the client disconnected)
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)

    def _confirmed(self, batch: list[Pending], replies: list[Any]) -> list[Any]:
        """The batch's replies, each write's replaced by NotConfirmed unless the WAIT at the end confirmed it."""
        assert self.settings is not None
        error = durability.check(self.settings, replies.pop())
        if error is None:
            return replies
        return [
            error if durability.is_write(args) and not isinstance(reply, Exception) else reply
            for (args, _, _, _), reply in zip(batch, replies, strict=True)
        ]

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        for _, _, future, _ in self._pending:
            future.cancel()
        self._pending.clear()
        await super().aclose(close_connection_pool)


class _HiredisPacking:
    """Packs commands with hiredis (byte for byte what redis-py's Python packer writes), one with a large argument
    (a big input's SET) in Python, uncopied (``connections.Packer``)."""

    def pack_command(self, *args: Any) -> list[bytes | memoryview]:
        return connections.PACKER.pack(*args)


class _JoiningPipeline(Pipeline):
    """A pipeline whose commands go out in the client's next batch, in order, next to each other."""

    def __init__(self, client: AutoPipelinedRedis) -> None:
        super().__init__(client.connection_pool, client.response_callbacks, False, None)
        self._client = client

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack, self.command_stack = self.command_stack, []
        futures = [self._client._join(args, options) for args, options in stack]
        # Joined with no await between them, so they leave in one batch, which keeps their deadline (``_send``).
        replies = list(await asyncio.gather(*futures, return_exceptions=True))
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
        return replies
