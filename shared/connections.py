"""Every Redis client inferq opens, from one URL, and what counts as "Redis cannot do this now".

``INFERQ_REDIS_URL`` is ``redis://``, ``rediss://``, ``unix://`` or a Sentinel group:
``redis+sentinel://[user:password@]host:port[,host:port…]/service_name[/db]`` (``rediss+sentinel://`` for TLS to
the data nodes), with query options ``sentinel_username``, ``sentinel_password`` and ``sentinel_ssl=true`` for the
sentinels themselves. A Sentinel URL goes to redis-py's own ``Sentinel``, which finds the primary and finds it
again after a failover (a connection to a demoted primary answering READONLY is dropped and looked up anew).

Every connection has a socket timeout, a connect timeout and TCP keepalive: a connection that dies silently
(a NAT or firewall dropping it, a frozen proxy) fails within ``timeout_s`` instead of hanging its caller for
good. redis-py's hidden retries are off: a command whose reply was lost may have run, and inferq's scripts are
not all idempotent; the callers that can retry (the worker's loops) do so themselves.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.connection
import redis.sentinel
from redis.backoff import NoBackoff
from redis.connection import Encoder, HiredisRespSerializer, PythonRespSerializer
from redis.retry import Retry
from redis.utils import HIREDIS_AVAILABLE

from inferq.shared.errors import ConfigError

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
# Idle connections are probed after this long, then every KEEPALIVE_INTERVAL_S, and dropped after
# KEEPALIVE_PROBES unanswered probes: a dead idle connection is noticed within about half a minute.
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_PROBES = 3
# An idle pooled connection is PINGed before use after this long (redis-py's health check).
HEALTH_CHECK_INTERVAL_S = 15
# The error replies by which Redis says "not now" rather than "wrong": full (noeviction at maxmemory), busy
# (a script past its time limit), loading, read-only (a demoted primary; a blocked command on it is UNBLOCKED),
# no replica, master down, try again.
# Inside a script's error reply the code follows a prefix ("ERR Error running script ...: -OOM ..." on Redis < 7).
_NOT_NOW = re.compile(r"(?:^|-|: )(OOM|BUSY|LOADING|READONLY|UNBLOCKED|NOREPLICAS|MASTERDOWN|TRYAGAIN|NOWRITE)\b")


@dataclass(frozen=True)
class Target:
    """Where a Redis URL points: a plain URL, or a Sentinel group's service."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    sentinel_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_sentinel(self) -> bool:
        return bool(self.sentinels)


def parse(url: str) -> Target:
    """The target of a Redis URL; ConfigError, naming what is wrong, for a malformed Sentinel URL."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in SENTINEL_SCHEMES:
        return Target(url)
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, has_password, secret = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if has_password else None)
    sentinels = []
    for host_port in filter(None, hosts.split(",")):
        host, port = _host_port(host_port, url)
        sentinels.append((host, port))
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2:
        raise ConfigError(
            "a Sentinel URL is redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db];"
            f" got {redact(url)}"
        )
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise ConfigError(f"the database in {redact(url)} must be a number") from None
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(query) - {"sentinel_username", "sentinel_password", "sentinel_ssl"}
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(sorted(unknown))} in {redact(url)}")
    sentinel_kwargs: dict[str, Any] = {}
    if "sentinel_username" in query:
        sentinel_kwargs["username"] = query["sentinel_username"]
    if "sentinel_password" in query:
        sentinel_kwargs["password"] = query["sentinel_password"]
    if query.get("sentinel_ssl", "").lower() in ("1", "true", "yes"):
        sentinel_kwargs["ssl"] = True
    return Target(
        url,
        tuple(sentinels),
        unquote(path[0]),
        db,
        username,
        password,
        ssl=scheme == "rediss+sentinel",
        sentinel_kwargs=sentinel_kwargs,
    )


def _host_port(text: str, url: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    try:
        port = int(port_text) if port_text else DEFAULT_SENTINEL_PORT
    except ValueError:
        raise ConfigError(f"bad sentinel address {text!r} in {redact(url)}") from None
    if not host or not 0 < port < 65536:
        raise ConfigError(f"bad sentinel address {text!r} in {redact(url)}")
    return host, port


def redact(url: str) -> str:
    """A Redis URL without its passwords, for logs and terminals."""
    url = re.sub(r"(sentinel_password=)[^&]*", r"\1***", url)
    head, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, hosts = rest.partition("@")
    if not at or "/" in userinfo:
        return url
    user, has_password, _ = userinfo.partition(":")
    return f"{head}://{user}:***@{hosts}" if has_password else url


def _keepalive_options() -> dict[int, int]:
    options = {}
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    ):
        if hasattr(socket, name):  # Linux has all three; macOS lacks TCP_KEEPIDLE under that name
            options[getattr(socket, name)] = value
    return options


def connection_options(timeout_s: float) -> dict[str, Any]:
    """What every connection gets: bounded socket and connect timeouts, keepalive, no hidden retries."""
    return {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "socket_keepalive": True,
        "socket_keepalive_options": _keepalive_options(),
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "retry": Retry(NoBackoff(), 0),
    }


def _sentinel_options(target: Target, timeout_s: float) -> dict[str, Any]:
    # The sentinels get the same timeouts (a frozen sentinel must not hang a failover lookup) and their own auth.
    base = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s, "socket_keepalive": True}
    return base | target.sentinel_kwargs


def _data_options(target: Target, timeout_s: float) -> dict[str, Any]:
    options = connection_options(timeout_s) | {"db": target.db}
    if target.username:
        options["username"] = target.username
    if target.password is not None:
        options["password"] = target.password
    if target.ssl:
        options["ssl"] = True
    return options


class SentinelConnection(redis.sentinel.SentinelManagedConnection):
    """redis-py's connection to a Sentinel group's primary, dropped when a read fails, as a plain connection is.

    redis-py's plain connection disconnects when a read is cut short (a timeout, or an exception a signal handler
    raises: RQ's stop raises one into a worker's blocking pop); its Sentinel connection does not by default, so the
    connection went back to its pool with the cut command's reply still to come, and the next command on it read
    that reply as its own (the stop's ``register_death`` pipeline: "Wrong number of response items from pipeline
    execution"). A caller that means to keep the connection (pub/sub's reads) still says so."""

    def read_response(
        self,
        disable_decoding: bool = False,
        *,
        disconnect_on_error: bool | None = True,
        push_request: bool | None = False,
    ) -> Any:
        return super().read_response(
            disable_decoding=disable_decoding, disconnect_on_error=disconnect_on_error, push_request=push_request
        )


class SentinelSSLConnection(SentinelConnection, redis.connection.SSLConnection):
    """``SentinelConnection`` over TLS (``rediss+sentinel://``)."""


# An argument past this is sent as it is, uncopied (``Packer``).
BIG_ARGUMENT = 64 * 1024


class Packer:
    """Packs commands in C with hiredis, but one with a large argument in redis-py's Python packer.

    hiredis copies a command into one new buffer: fast for small ones (0.6 us a SET of 300 bytes, 2.8 of 34 KB),
    but past about 128 KB each new buffer costs page faults (144 us for 200 KB, 2.7 ms for a 2.2 MB bulk chunk:
    a third of a bulk line's API time). redis-py's packer hands a large argument to the socket as it is (4 us for the
    chunk). Only commands of a few arguments are looked at (a value's SET): a script's many small ones go to hiredis
    unread.
    """

    def __init__(self) -> None:
        self._fast = HiredisRespSerializer() if HIREDIS_AVAILABLE else None
        self._python = PythonRespSerializer(BIG_ARGUMENT, Encoder("utf-8", "strict", False).encode)

    def pack(self, *args: Any) -> list[bytes | memoryview]:
        if self._fast is None:
            return self._python.pack(*args)  # type: ignore[no-any-return]
        if len(args) <= 8:
            for arg in args:
                if isinstance(arg, (bytes, bytearray, memoryview)) and len(arg) > BIG_ARGUMENT:
                    return self._python.pack(*args)  # type: ignore[no-any-return]
        return self._fast.pack(*args)  # type: ignore[no-any-return]


PACKER = Packer()


def connect(url: str, timeout_s: float, **extra: Any) -> redis.Redis:
    """A synchronous client (workers, the API's threadpool paths, the CLI), its commands packed by ``PACKER``."""
    extra = {"command_packer": PACKER} | extra
    target = parse(url)
    if not target.is_sentinel:
        return redis.Redis.from_url(url, **(connection_options(timeout_s) | extra))
    sentinel = redis.sentinel.Sentinel(
        list(target.sentinels), sentinel_kwargs=_sentinel_options(target, timeout_s), **_data_options(target, timeout_s)
    )
    connection_class = SentinelSSLConnection if target.ssl else SentinelConnection
    return sentinel.master_for(target.service, connection_class=connection_class, **extra)


def async_pool(url: str, timeout_s: float, max_connections: int) -> redis.asyncio.ConnectionPool:
    """The API's asyncio connection pool: a caller waits at most ``timeout_s`` for a free connection.

    Its connections carry no read timeout of their own: every command on them goes out in an auto-pipelined
    batch (api/autopipeline.py), which must be answered by its commands' deadline and drops its connection
    if not. A socket timeout too would arm a timer per reply read (redis-py wraps each read in one): a tenth
    of a submit's CPU for no bound the batch does not already keep. Connecting stays bounded by ``timeout_s``.
    """
    target = parse(url)
    read = {"socket_timeout": None}
    if not target.is_sentinel:
        return redis.asyncio.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout_s, **(connection_options(timeout_s) | read)
        )
    sentinel = redis.asyncio.sentinel.Sentinel(
        list(target.sentinels), sentinel_kwargs=_sentinel_options(target, timeout_s), **_data_options(target, timeout_s)
    )
    options = dict(sentinel.connection_kwargs) | read | {"is_master": True, "max_connections": max_connections}
    return redis.asyncio.sentinel.SentinelConnectionPool(target.service, sentinel, **options)


def async_client(url: str, timeout_s: float, **extra: Any) -> redis.asyncio.Redis:
    """An asyncio client of its own (the API's event subscriber)."""
    target = parse(url)
    if not target.is_sentinel:
        return redis.asyncio.Redis.from_url(url, **(connection_options(timeout_s) | extra))
    sentinel = redis.asyncio.sentinel.Sentinel(
        list(target.sentinels), sentinel_kwargs=_sentinel_options(target, timeout_s), **_data_options(target, timeout_s)
    )
    return sentinel.master_for(target.service, **extra)


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis cannot do this now (down, slow, paused, full, busy, loading, demoted, without its
    replicas) rather than that the request was wrong: the API answers 503, a worker waits and carries on."""
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return True  # also LOADING (BusyLoadingError) and a Sentinel group with no primary (MasterNotFoundError)
    if isinstance(exc, redis.exceptions.ReadOnlyError | redis.exceptions.OutOfMemoryError):
        return True
    return isinstance(exc, redis.exceptions.ResponseError) and _NOT_NOW.search(str(exc)) is not None


def why_unavailable(exc: BaseException) -> str:
    """A short, URL-free reason for logs and 503 answers."""
    if getattr(exc, "reason", None):  # shared.durability.NotConfirmed: which confirmation failed, and why
        return str(exc.reason)  # type: ignore[attr-defined]
    if isinstance(exc, redis.exceptions.TimeoutError):
        return "Redis did not answer in time"
    if isinstance(exc, redis.exceptions.BusyLoadingError):
        return "Redis is loading its data"
    if isinstance(exc, redis.exceptions.ConnectionError):
        return "Redis cannot be reached"
    # redis-py strips the error code from the replies it has a class for.
    classes = {redis.exceptions.OutOfMemoryError: "OOM", redis.exceptions.ReadOnlyError: "READONLY"}
    found = _NOT_NOW.search(str(exc))
    code = next(
        (c for cls, c in classes.items() if isinstance(exc, cls)), found.group(1) if found else type(exc).__name__
    )
    return {
        "OOM": "Redis is full (maxmemory reached)",
        "BUSY": "Redis is busy running a script",
        "LOADING": "Redis is loading its data",
        "READONLY": "Redis is a read-only replica (a failover is under way)",
        "UNBLOCKED": "Redis became a read-only replica (a failover is under way)",
        "NOREPLICAS": "Redis has too few replicas to accept writes",
        "MASTERDOWN": "Redis lost its primary",
    }.get(code, f"Redis cannot do this now ({code})")
