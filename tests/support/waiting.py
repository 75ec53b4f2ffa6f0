"""Waiting for something another thread or process does, polled, with a deadline; or, for a long stream of work,
for as long as it keeps moving (``wait_while_moving``)."""

from __future__ import annotations

import time
from typing import Any


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_while_moving(progress: Any, done: Any, stall_s: float, what: str) -> None:
    """Wait until ``done()``, for as long as ``progress()`` (a count, or any comparable state) keeps changing: it
    fails only once nothing moved for ``stall_s``. For a stream of work whose length a loaded machine stretches
    (a thousand webhooks sent one by one), where a deadline measured the machine rather than the code."""
    last, moved = progress(), time.monotonic()
    while not done():
        time.sleep(0.1)
        now = progress()
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall_s:
            raise AssertionError(f"timed out waiting for {what}: nothing moved for {stall_s:g} s (at {last})")
