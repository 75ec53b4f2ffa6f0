"""What an acknowledgement means (``INFERQ_DURABILITY``), and the command that makes it true.

- ``async``: Redis has the write in memory (and, with AOF ``everysec``, on disk within about a second); a
  failover may lose what its replicas had not received yet.
- ``replica``: ``WAIT n`` confirmed that ``n`` replicas (``INFERQ_DURABILITY_REPLICAS``) have it before a 202, a
  cancel's 200 or a job's end event goes out. WAIT covers every earlier write of its connection, so one WAIT per
  pipeline covers all the submits in it (group commit).
- ``fsync``: ``WAITAOF 1 0`` confirmed the primary's AOF has it on disk (Redis / Valkey >= 7.2).

A write not confirmed in ``INFERQ_DURABILITY_TIMEOUT_MS`` is answered 503 + Retry-After (it may still survive:
Redis has it, no replica confirmed it), never silently acknowledged as ``async``.
"""

from __future__ import annotations

from typing import Any, cast

import redis

from inferq.shared import keys
from inferq.shared.errors import ConfigError
from inferq.shared.settings import Settings

# Commands the API sends that write nothing: a pipeline of these alone needs no WAIT.
READ_ONLY = frozenset(
    {
        "GET",
        "MGET",
        "HGET",
        "HMGET",
        "HGETALL",
        "HEXISTS",
        "HLEN",
        "LLEN",
        "LRANGE",
        "LINDEX",
        "EXISTS",
        "TTL",
        "PTTL",
        "TYPE",
        "SCARD",
        "SMEMBERS",
        "SISMEMBER",
        "ZCARD",
        "ZCOUNT",
        "ZRANGE",
        "ZSCORE",
        "XLEN",
        "XRANGE",
        "XREVRANGE",
        "PING",
        "INFO",
        "EVALSHA_RO",
        "EVAL_RO",
    }
)
FSYNC_MIN_VERSION = (7, 2)


class NotConfirmed(redis.exceptions.ResponseError):
    """A write Redis took but no replica (or disk) confirmed in time; read as "not now" (503), with its reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"NOREPLICAS {reason}")
        self.reason = reason


def confirm_command(settings: Settings) -> tuple[Any, ...] | None:
    """The command that confirms the writes before it on its connection; None for ``async``."""
    if settings.durability == "replica":
        return ("WAIT", settings.durability_replicas, settings.durability_timeout_ms)
    if settings.durability == "fsync":
        return ("WAITAOF", 1, 0, settings.durability_timeout_ms)
    return None


def is_write(args: tuple[Any, ...]) -> bool:
    name = args[0]
    text = name.decode() if isinstance(name, bytes) else str(name)
    return text.upper() not in READ_ONLY


def check(settings: Settings, reply: Any) -> NotConfirmed | None:
    """The error to give the writes that ``reply`` (of ``confirm_command``) did not confirm, or None."""
    if isinstance(reply, Exception):
        return NotConfirmed(f"the writes could not be confirmed: {reply}")
    if settings.durability == "replica" and int(reply) < settings.durability_replicas:
        wanted = settings.durability_replicas
        return NotConfirmed(
            f"{int(reply)} of {wanted} replica(s) confirmed the write within"
            f" {settings.durability_timeout_ms} ms (INFERQ_DURABILITY=replica)"
        )
    if settings.durability == "fsync" and int(reply[0]) < 1:
        return NotConfirmed(f"the AOF fsync was not confirmed within {settings.durability_timeout_ms} ms")
    return None


def server_version(info: dict[str, Any]) -> tuple[int, ...]:
    """A server's version from INFO server: Valkey reports its own beside the Redis version it is compatible with."""
    text = str(info.get("valkey_version") or info.get("redis_version") or "0")
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def check_server(connection: redis.Redis, settings: Settings) -> None:
    """ConfigError when the server cannot give what ``INFERQ_DURABILITY`` asks (WAITAOF needs Redis >= 7.2 and
    the AOF on); a server that cannot be reached now is checked by the first write's confirmation instead."""
    if settings.durability != "fsync":
        return
    try:
        version = server_version(cast(dict[str, Any], connection.info("server")))
        aof = int(cast(dict[str, Any], connection.info("persistence")).get("aof_enabled", 0))
    except redis.RedisError:
        return
    if version < FSYNC_MIN_VERSION:
        shown = ".".join(map(str, version))
        raise ConfigError(
            f"INFERQ_DURABILITY=fsync needs WAITAOF (Redis or Valkey >= 7.2); this server is {shown}:"
            " use INFERQ_DURABILITY=replica or async, or a newer server"
        )
    if not aof:
        raise ConfigError("INFERQ_DURABILITY=fsync needs the server's append-only file on (appendonly yes)")


def online_replicas(info: dict[str, Any]) -> int:
    """Replicas that can acknowledge now: online, and acknowledged once (connected_slaves also counts a replica
    still receiving its first copy, and one that has it but is still loading it has acknowledged nothing yet)."""
    return sum(
        1
        for name, value in info.items()
        if name.startswith("slave") and isinstance(value, dict)
        if value.get("state") == "online" and int(value.get("offset") or 0) > 0
    )


def readiness(connection: redis.Redis, settings: Settings) -> tuple[int | None, str | None]:
    """(connected replicas, the reason writes cannot be acknowledged now or None)."""
    if settings.durability != "replica":
        return None, None
    replicas = online_replicas(cast(dict[str, Any], connection.info("replication")))
    if replicas < settings.durability_replicas:
        return replicas, (
            f"INFERQ_DURABILITY=replica needs {settings.durability_replicas} connected replica(s), Redis has"
            f" {replicas}: submits and cancels answer 503 until one connects"
        )
    return replicas, None


def defers(settings: Settings) -> bool:
    """Whether end events wait until the writes that ended them are confirmed (``replica`` and ``fsync``)."""
    return settings.durability != "async"


def confirm_all(connection: redis.Redis, settings: Settings) -> NotConfirmed | None:
    """Wait until every write Redis took before this call is confirmed; the error when it is not, else None.

    WAIT (and WAITAOF) wait for the offset of their own connection's last write: a small write of our own first
    (a probe key with a TTL) makes that offset cover every earlier write, whoever made it.
    """
    command = confirm_command(settings)
    if command is None:
        return None
    with connection.pipeline(transaction=False) as pipe:
        pipe.set(keys.DURABILITY_PROBE_KEY, "1", ex=keys.DURABILITY_PROBE_TTL_S)
        pipe.execute_command(*command)
        replies = pipe.execute(raise_on_error=False)
    if isinstance(replies[0], Exception):
        return check(settings, replies[0])
    return check(settings, replies[1])


def release(connection: redis.Redis, settings: Settings, events: list[bytes]) -> None:
    """Publish end events a script deferred, once their writes are confirmed; NotConfirmed (a 503) if they are not."""
    if not events:
        return
    error = confirm_all(connection, settings)
    if error is not None:
        raise error
    with connection.pipeline(transaction=False) as pipe:
        for event in events:
            pipe.publish(keys.EVENTS_CHANNEL, event)
        pipe.execute()
