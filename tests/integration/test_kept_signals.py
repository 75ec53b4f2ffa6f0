"""An in-process RQ worker's stop handlers end with its test: SIGINT and SIGTERM are the test process's again."""

from __future__ import annotations

import signal

import pytest
import redis as redis_py

from inferq.shared.settings import Settings
from tests.support.echo import echo_worker, submit_echo
from tests.support.signals import STOP_SIGNALS, kept_signal_handlers


def test_after_an_in_process_worker_sigint_and_sigterm_are_handled_as_before(
    redis: redis_py.Redis, redis_url: str, request: pytest.FixtureRequest
) -> None:
    settings = Settings(redis_url=redis_url)
    # Python's own Ctrl-C handler, whatever this process inherited (a suite started in a script's background has
    # SIGINT ignored): the handler the worker must give back is then a real one. The fixture restores the original.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    with kept_signal_handlers():
        submit_echo(redis, settings, [1, 2])
        worker = echo_worker(redis, settings)
        worker.work(burst=True)
        # RQ's own stop requests: a Ctrl-C here would raise StopRequested, not stop pytest.
        assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == dict.fromkeys(STOP_SIGNALS, worker.request_stop)
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before
    assert before[signal.SIGINT] is signal.default_int_handler
    # Every test runs inside it (tests/conftest.py): the next test starts with the handlers this one began with.
    assert "_kept_signal_handlers" in request.fixturenames
