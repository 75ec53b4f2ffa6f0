"""The unit lane runs in-process only: a test here that reaches the session's redis-server fails before it starts."""

from __future__ import annotations

import pytest

# The fixture every Redis-facing fixture leads back to (redis, redis_url): it starts a redis-server.
SERVER_FIXTURE = "redis_server"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if SERVER_FIXTURE in getattr(item, "fixturenames", ()):
        pytest.fail(f"{item.nodeid} uses the session's redis-server: it belongs in tests/integration", pytrace=False)
