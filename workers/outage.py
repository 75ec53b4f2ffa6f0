"""How a worker waits out Redis: nothing Redis does short of losing its data ends the process.

Down, slow, paused, full (noeviction at maxmemory), busy (a script past its time limit), loading, or a primary
demoted to a read-only replica (``shared.connections.is_unavailable``): housekeeping is skipped, a claim or a
start is tried again after a pause that grows to ``MAX_PAUSE_S``, results already computed are kept until they
can be stored. RQ's own loop quits on any exception that reaches it, so none of these may.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from inferq.shared.connections import is_unavailable, why_unavailable

log = logging.getLogger("inferq.workers.outage")
T = TypeVar("T")
FIRST_PAUSE_S = 0.25
MAX_PAUSE_S = 5.0


class Outage:
    """One process's view of Redis's availability: a capped backoff, and one log line per change, not per try."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.pause_s = FIRST_PAUSE_S
        self.since: float | None = None
        self.reason = ""

    def saw(self, exc: BaseException, doing: str) -> float:
        """Note an unavailable Redis while ``doing``; the pause to take before trying again."""
        reason = why_unavailable(exc)
        if self.since is None or reason != self.reason:
            log.warning("%s: %s while %s; waiting for it (%s)", self.who, reason, doing, type(exc).__name__)
            self.since = self.since or time.monotonic()
            self.reason = reason
        pause_s = self.pause_s
        self.pause_s = min(self.pause_s * 2, MAX_PAUSE_S)
        return pause_s

    def ok(self) -> None:
        """Redis answered: say so once, and start the backoff again from the beginning."""
        if self.since is not None:
            log.warning("%s: Redis is back after %.1f s", self.who, time.monotonic() - self.since)
        self.since, self.reason, self.pause_s = None, "", FIRST_PAUSE_S

    def skip(self, call: Callable[[], T], doing: str) -> T | None:
        """Run a housekeeping call; while Redis is unavailable, skip it (after a short pause) rather than quit."""
        try:
            result = call()
        except redis.exceptions.RedisError as exc:
            if not is_unavailable(exc):
                raise
            time.sleep(min(self.saw(exc, doing), 1.0))
            return None
        self.ok()
        return result

    def wait(self, call: Callable[[], T], doing: str) -> T:
        """Run ``call`` until it succeeds, pausing while Redis is unavailable; other errors propagate."""
        while True:
            try:
                result = call()
            except redis.exceptions.RedisError as exc:
                if not is_unavailable(exc):
                    raise
                time.sleep(self.saw(exc, doing))
                continue
            self.ok()
            return result


class CommandChannel:
    """How a worker's RQ command channel (the pub/sub thread that hears `rq` stop and kill commands) waits out Redis.

    RQ's own handler logged an ERROR and tried again every 2 s for as long as Redis could not be reached: through a
    Sentinel failover's whole window, from every worker and the webhook sender, while their main loops waited it out
    with one line. Here it is one line when lost and one when back, on the main loop's backoff; the thread subscribes
    again by itself once it reconnects (redis-py's on-connect callback), to a Sentinel group's new primary too.
    """

    def __init__(self, who: str) -> None:
        self.outage = Outage(f"{who} (command channel)")

    def lost(self, exc: BaseException, pubsub: Any) -> None:
        """The pub/sub thread's exception handler: an unavailable Redis is waited out, anything else ends it."""
        if not isinstance(exc, redis.exceptions.RedisError) or not is_unavailable(exc):
            log.warning("%s: stops listening for commands on %s", self.outage.who, exc)
            raise exc
        time.sleep(self.outage.saw(exc, "listening for commands"))
        try:
            if pubsub.connection is not None:
                pubsub.connection.connect()
        except redis.exceptions.RedisError as again:
            if not is_unavailable(again):
                raise
            return  # the thread's next read meets it again, and comes back here
        self.outage.ok()


def register_through(outage: Outage, worker: Any, birth: Callable[[], None], then: Callable[[], None]) -> None:
    """RQ's ``register_birth`` (``birth``), then ``then``, tried until Redis takes both, each try's birth kept.

    RQ refuses a name whose hash is there with no death: "There exists an active worker named ...". A try whose
    reply was lost, or whose ``then`` met a busy Redis, has already written that hash, so trying the birth again
    ended the process (a loaded CI run: a webhook sender's queue registration met a script). The name is this
    process's own (its pid and a random suffix, or one an operator gave it, which RQ checks on the first try), so a
    live hash under it after a try is that try's, and the retry goes on from ``then``.
    """
    tried = False

    def once() -> None:
        nonlocal tried
        conn = worker.connection
        if not (tried and conn.exists(worker.key) and not conn.hexists(worker.key, "death")):
            tried = True
            birth()
        then()

    outage.wait(once, "registering")
