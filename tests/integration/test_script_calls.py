"""Scripts by hash (shared/lifecycle/lua.py): a body crosses to Redis only when the server lacks it, on a real Redis,
and a server that lost its scripts (a restart, SCRIPT FLUSH) still runs every call."""

from __future__ import annotations

import pytest
import redis as redis_py

from inferq.shared.lifecycle import lua
from inferq.shared.lifecycle.lua import Script
from tests.support.counting import counting_client

COUNT = Script("count", ("counter",), "return redis.call('INCR', K.counter)")


def _script_stats(redis: redis_py.Redis) -> dict[str, int]:
    stats = redis.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("eval", "evalsha", "script|load")}


def _calls(redis: redis_py.Redis, before: dict[str, int]) -> dict[str, int]:
    return {name: calls - before[name] for name, calls in _script_stats(redis).items()}


def test_direct_calls_and_pipelines_send_the_body_once(redis: redis_py.Redis, redis_url: str) -> None:
    redis.script_flush()
    client = counting_client(redis_url)
    before = _script_stats(redis)
    for _ in range(5):
        COUNT(client, ["c"])
    assert _calls(redis, before) == {"eval": 1, "evalsha": 5, "script|load": 0}  # one NOSCRIPT, then by hash
    redis.script_flush()
    before = _script_stats(redis)
    for _ in range(5):
        with client.pipeline(transaction=True) as pipe:
            COUNT(pipe, ["c"])
            pipe.incr("c")
            assert pipe.execute()[1] == int(redis.get("c") or 0)
    calls = _calls(redis, before)
    assert calls["script|load"] == 1 and calls["evalsha"] == 5 and calls["eval"] == 0
    assert int(redis.get("c") or 0) == 15
    client.close()


def test_a_server_that_lost_its_scripts_runs_the_next_pipeline(
    redis: redis_py.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart closes the sockets: the connection that comes next loads again. A SCRIPT FLUSH on a live socket is
    healed once the socket's trust ends (``LOADED_TRUST_S``)."""
    client = redis_py.Redis.from_url(redis_url)
    with client.pipeline(transaction=True) as pipe:
        COUNT(pipe, ["c"])
        assert pipe.execute() == [1]
    redis.script_flush()
    client.connection_pool.disconnect()  # as a restart leaves it: a new socket
    with client.pipeline(transaction=True) as pipe:
        COUNT(pipe, ["c"])
        assert pipe.execute() == [2]
    redis.script_flush()
    monkeypatch.setattr(lua, "LOADED_TRUST_S", 0.0)
    with client.pipeline(transaction=False) as pipe:
        COUNT(pipe, ["c"])
        assert pipe.execute() == [3]
    client.close()
