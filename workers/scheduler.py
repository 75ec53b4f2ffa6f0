"""The webhook sender's RQ scheduler: the process that puts each delivery retry, due, back in the sender's queue.

RQ's scheduler runs in a process of its own, forked by the sender, on a client RQ builds from the sender's
connection (its pool's settings and connection class: a Sentinel group's primary is found again after a failover).
Its loop has no handler for Redis: any error ended the process with a traceback (every failover: it heartbeats each
second), and the sender forked another at its next maintenance. Here each step that meets an unavailable Redis is
skipped and tried again at the next turn, with one line when Redis is lost and one when it is back.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from rq.scheduler import RQScheduler

from inferq.shared.connections import is_unavailable
from inferq.workers.outage import Outage


class Scheduler(RQScheduler):
    """RQ's scheduler, waiting out an unavailable Redis (workers/outage.py) instead of ending its process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outage = Outage(f"webhook scheduler {self.name}")

    def take_up(self, burst: bool) -> None:
        """What RQ's worker does with a new scheduler: its locks taken, then its loop in a process of its own, or for
        a burst one pass here. Locks another sender's scheduler holds are left to it; maintenance asks again."""
        self.acquire_locks()
        if not self.acquired_locks:
            return
        if not burst:
            self.start()
            return
        try:
            self.register_birth()
            self.enqueue_scheduled_jobs()
        finally:
            self.release_locks()
            self.register_death()

    def register_birth(self) -> None:
        """Its hash (what `rq info` and a restart's cleanup read), tried until Redis takes it or a stop is asked."""
        while not self._stop_requested:
            try:
                super().register_birth()
            except redis.exceptions.RedisError as exc:
                if not is_unavailable(exc):
                    raise
                time.sleep(self.outage.saw(exc, "registering"))
                continue
            self.outage.ok()
            return

    def acquire_locks(self, auto_start: bool = False) -> set[str]:
        return self.outage.skip(lambda: super(Scheduler, self).acquire_locks(auto_start), "taking its locks") or set()

    def heartbeat(self) -> None:
        self.outage.skip(super().heartbeat, "sending a heartbeat")

    def enqueue_scheduled_jobs(self) -> None:
        self.outage.skip(super().enqueue_scheduled_jobs, "queueing the retries that are due")

    def stop(self) -> None:
        """RQ's: its locks released, its hash removed; skipped while Redis is unavailable (both expire)."""
        self.outage.skip(super().stop, "releasing its locks")
