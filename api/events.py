"""One pub/sub subscriber per API process, fanning job events out to waiting requests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import redis

from inferq.shared import connections, keys
from inferq.shared.jobs import TERMINAL

log = logging.getLogger(__name__)
# An idle subscription is PINGed this often; no answer within the Redis timeout and it is dropped and made
# again (a NAT or proxy may have dropped it silently: no event would ever arrive on it).
PING_EVERY_S = 5.0
# What a waiting request's queue receives when the API stops (EventHub.release): it answers at once.
STOPPING: dict[str, Any] = {"kind": "stopping"}


class EventHub:
    """Wakes the requests waiting on a job when its event arrives on ``keys.EVENTS_CHANNEL``."""

    def __init__(self, redis_url: str, timeout_s: float = 3.0) -> None:
        self.redis_url = redis_url
        self.timeout_s = timeout_s
        # job id -> each waiting queue, and whether it wants only the end (not "started" and the like).
        self._waiters: dict[str, dict[asyncio.Queue[dict[str, Any]], bool]] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._released = False
        self.connected = asyncio.Event()
        # Told the model of each rollback or rollout event (api/versions.py reads its versions afresh at once).
        self.on_routing_change: Callable[[str], None] | None = None

    async def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._listen(), name="inferq-events")

    async def stop(self) -> None:
        """End the subscription. The listener also checks ``_stopping`` after each read: a cancel that lands as a
        read's own timeout expires is swallowed by Python 3.11's asyncio.timeout (redis-py then answers the read
        with "no message"), and an app's shutdown waited on the listener for ever."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def release(self) -> None:
        """The API is stopping: every request waiting here gets ``STOPPING`` now, and one that begins to wait later at
        once. uvicorn's stop waits for the open connections to close before it ends the app, and a request waiting
        on an unfinished job held it until the supervisor killed the API, its client never answered at all."""
        self._released = True
        for waiters in self._waiters.values():
            for queue in waiters:
                queue.put_nowait(STOPPING)

    @contextlib.contextmanager
    def subscribe(self, job_id: str, *, ends_only: bool = False) -> Iterator[asyncio.Queue[dict[str, Any]]]:
        """A queue that receives the events of ``job_id`` while the block runs: every one, or with
        ``ends_only`` just the terminal ones (a request waiting for the result is not woken by "started"); and
        ``STOPPING`` once the API stops."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._waiters.setdefault(job_id, {})[queue] = ends_only
        if self._released:
            queue.put_nowait(STOPPING)
        try:
            yield queue
        finally:
            waiters = self._waiters.get(job_id)
            if waiters is not None:
                waiters.pop(queue, None)
                if not waiters:
                    del self._waiters[job_id]

    @property
    def waiting(self) -> int:
        return sum(len(v) for v in self._waiters.values())

    async def _listen(self) -> None:
        backoff_s = 0.1
        while not self._stopping:
            client = connections.async_client(self.redis_url, self.timeout_s)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(keys.EVENTS_CHANNEL)
                    self.connected.set()
                    backoff_s = 0.1
                    await self._pump(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Waiters re-read the job on their own timer, so a missed event only delays them.
                self.connected.clear()
                if self._stopping:
                    return
                log.warning("event subscriber lost Redis (%s); reconnecting", type(exc).__name__)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 5.0)
            finally:
                await client.aclose()

    async def _pump(self, pubsub: Any) -> None:
        """Dispatch events until the subscription fails or stops answering its PING."""
        loop = asyncio.get_running_loop()
        heard_at, pinged_at = loop.time(), None
        while not self._stopping:
            message = await pubsub.get_message(timeout=min(1.0, PING_EVERY_S))
            now = loop.time()
            if message is not None:
                heard_at, pinged_at = now, None
                if message.get("type") == "message":
                    self._dispatch(message["data"])
                continue
            if pinged_at is not None and now - pinged_at > self.timeout_s:
                raise redis.exceptions.TimeoutError("the event subscription stopped answering")
            if pinged_at is None and now - heard_at >= PING_EVERY_S:
                await pubsub.ping()
                pinged_at = now

    def _dispatch(self, data: bytes | str) -> None:
        try:
            event = json.loads(data)
            waiters = self._waiters.get(event["id"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring malformed event %r", data[:200])
            return
        if event.get("kind") in ("rollback", "rollout") and self.on_routing_change is not None:
            self.on_routing_change(str(event.get("model")))
        if not waiters:
            return
        ended = event.get("status") in TERMINAL
        for queue, ends_only in list(waiters.items()):
            if ended or not ends_only:
                queue.put_nowait(event)
