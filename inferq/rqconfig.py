"""rq's own settings from ``INFERQ_REDIS_URL``, a Sentinel group's included: ``rq info -c inferq.rqconfig``.

rq's command line takes a plain URL (``-u``) only; a config module (``-c``) is its one way to a Sentinel group, and
this one reads the same URL inferq's processes read, so ``rq info`` looks where they look.
"""

from __future__ import annotations

from typing import Any

from inferq.shared.connections import parse
from inferq.shared.settings import get_settings

_target = parse(get_settings().redis_url or "redis://127.0.0.1:6379/0")
if _target.is_sentinel:
    SENTINEL: dict[str, Any] = {
        "INSTANCES": list(_target.sentinels),
        "MASTER_NAME": _target.service,
        "DB": _target.db,
        "USERNAME": _target.username,
        "PASSWORD": _target.password,
        "SSL": _target.ssl,
        "SOCKET_TIMEOUT": 10,
        "SENTINEL_KWARGS": _target.sentinel_kwargs,
    }
else:
    REDIS_URL = _target.url
