"""A Redis connection that counts round trips: one per packed command sent (a pipeline is one).

Only what the code under test sends counts: a connection's own handshake (CLIENT SETINFO, HELLO, AUTH, SELECT on
connect) is left out. Whether a thread needs a second pooled connection depends on what another thread is doing
at that moment, so counting the handshake made a count test read the clock (defect: {1: 6, 16: 5} under load).
A script's SCRIPT LOAD before the first pipeline a connection sends it in (shared/lifecycle/lua.py ``_loaded_on``)
is left out likewise: once per connection, like the handshake.
"""

from __future__ import annotations

from typing import Any

import redis


class CountingConnection(redis.Connection):
    sent = 0
    _connecting = False

    def on_connect_check_health(self, check_health: bool = True) -> None:
        self._connecting = True
        try:
            super().on_connect_check_health(check_health)
        finally:
            self._connecting = False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._connecting and not _loads_a_script(command):
            type(self).sent += 1
        super().send_packed_command(command, check_health)


def _loads_a_script(command: Any) -> bool:
    first = command[0] if isinstance(command, list) else command
    return bytes(first[:32]).upper().startswith(b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n")


def counting_client(url: str) -> redis.Redis:
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    return redis.Redis(connection_pool=pool)
