"""The API's event hub wakes a request waiting for a result only when its job ends; streams get every event."""

from __future__ import annotations

import json

from api.events import EventHub


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
