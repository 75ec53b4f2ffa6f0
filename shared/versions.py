"""A model version's state as its workers tell it: ``loading`` and ``warming`` while one starts, ``ready`` once it
serves, ``failed`` with the reason when its load or warm-up failed. Written by the worker (``tell``), read by the API
for ``GET /v1/models`` and the status page (``read_states``); a version receives unpinned jobs only once a worker is
registered on its queue, which a worker does only after it is ready (api/versions.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from redis.exceptions import RedisError

from inferq.shared import keys

log = logging.getLogger(__name__)

STATES = ("loading", "warming", "ready", "failed")


@dataclass(frozen=True)
class VersionState:
    state: str
    reason: str | None = None
    weights_sha256: str | None = None
    worker: str | None = None
    at: float | None = None

    @classmethod
    def of(cls, raw: dict[bytes, bytes]) -> VersionState | None:
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        if fields.get("state") not in STATES:
            return None
        return cls(
            fields["state"],
            fields.get("reason") or None,
            fields.get("weights_sha256") or None,
            fields.get("worker") or None,
            float(fields["at"]) if fields.get("at") else None,
        )


def tell(connection: Any, served: str, state: str, reason: str | None = None, weights: str | None = None) -> None:
    """Record a version's state as this worker sees it; a Redis that cannot take it only costs the record (logged)."""
    fields = {"state": state, "reason": reason or "", "worker": socket.gethostname(), "at": f"{time.time():.3f}"}
    if weights is not None:
        fields["weights_sha256"] = weights
    key = keys.version_state_key(served)
    try:
        with connection.pipeline(transaction=True) as pipe:
            if state != "ready":  # a new load's hash is not known yet: the old one would mislead
                pipe.hdel(key, "weights_sha256")
            pipe.hset(key, mapping=fields)
            pipe.expire(key, keys.VERSION_STATE_TTL_S)
            pipe.execute()
    except RedisError as exc:
        log.warning("model %s: could not record its state %s in Redis (%s)", served, state, exc)


async def read_states(client: Any, served: Iterable[str]) -> dict[str, VersionState | None]:
    """The told state of each served name (None: never told, or expired)."""
    names = list(served)
    reads = [cast(Awaitable[dict[bytes, bytes]], client.hgetall(keys.version_state_key(n))) for n in names]
    replies = await asyncio.gather(*reads)  # one round trip on the API's auto-pipelined client
    return {name: VersionState.of(raw) for name, raw in zip(names, replies, strict=True)}
