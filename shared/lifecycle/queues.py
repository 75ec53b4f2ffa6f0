"""The set of queues RQ's tools list: every queue inferq serves is in it from the moment it is served.

RQ adds a queue to its queues set only when something is enqueued there, and ``rq info`` (like
rq-dashboard) lists the queues of that set and, when there are any, only the workers listening
on one of them: a webhook sender or a bulk lane with nothing queued yet stayed invisible.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis import Redis

from inferq.shared.lifecycle import layout


def register_queues(connection: Redis, names: Iterable[str]) -> None:
    """Add the queues to RQ's queues set (idempotent); a worker calls it when it registers."""
    queue_keys = [layout.offline_queue(name).key for name in names]
    if queue_keys:
        # RQ's own structural set, which RQ never expires either; its members are the queues' list keys.
        connection.sadd(layout.QUEUES_SET, *queue_keys)
