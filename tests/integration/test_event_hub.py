"""The API's event hub wakes a request waiting for a result only when its job ends; streams get every event."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis as redis_py
import redis.asyncio.client

from inferq.api.events import EventHub


def test_a_waiter_for_the_end_is_not_woken_by_started_and_a_stream_is() -> None:
    hub = EventHub("redis://unused")
    with hub.subscribe("a", ends_only=True) as waiter, hub.subscribe("a") as stream, hub.subscribe("b") as other:
        hub._dispatch(json.dumps({"id": "a", "status": "started"}))
        assert waiter.qsize() == 0 and stream.qsize() == 1
        hub._dispatch(json.dumps({"id": "a", "status": "finished"}))
        assert waiter.get_nowait()["status"] == "finished"
        assert [stream.get_nowait()["status"] for _ in range(2)] == ["started", "finished"]
        assert other.qsize() == 0
        hub._dispatch(b"not json")  # logged and ignored
        assert hub.waiting == 3
    assert hub.waiting == 0 and not hub._waiters


def test_stop_ends_the_listener_even_when_a_read_swallows_its_cancel(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.11's asyncio.timeout swallows a cancel that lands as the read's own timeout expires, and redis-py
    then answers the read with "no message": the listener read on, and an app's shutdown waited on it for ever
    (7 runs in 8 of an in-process app's lifespan beside two busy loops)."""
    real = redis_py.asyncio.client.PubSub.get_message

    async def swallowing(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await real(self, *args, **kwargs)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            return None

    monkeypatch.setattr(redis_py.asyncio.client.PubSub, "get_message", swallowing)

    async def run() -> None:
        hub = EventHub(redis_url, 1.0)
        await hub.start()
        await asyncio.wait_for(hub.connected.wait(), 10)
        await asyncio.wait_for(hub.stop(), 10)

    asyncio.run(run())
