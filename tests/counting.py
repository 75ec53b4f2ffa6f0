"""A Redis connection that counts round trips: one per packed command sent (a pipeline is one)."""

from __future__ import annotations

from typing import Any

import redis


class CountingConnection(redis.Connection):
    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sent += 1
        super().send_packed_command(command, check_health)


def counting_client(url: str) -> redis.Redis:
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    return redis.Redis(connection_pool=pool)
