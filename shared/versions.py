"""A model version's state as its workers tell it: ``loading`` and ``warming`` while one starts, ``ready`` once it
serves, ``failed`` with the reason when its load or warm-up failed. Written by the worker (``tell``), read by the API
for ``GET /v1/models`` and the status page (``read_states``); a version receives unpinned jobs only once a worker is
registered on its queue, which a worker does only after it is ready (api/versions.py).

And its rollback: a version of a model with several whose recent jobs fail too often, or whose warm-up fails on a
new worker, is rolled back by the system itself (``judge``, ``roll_back``): the API routes no unpinned job to it
while the record stands (``read_rollbacks``), until it is restored (``restore``) or a worker loads other weights.

And the traffic and ramp an operator sets through the API (``set_rollout``), over the model's config.json's."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import time
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from pydantic import ValidationError
from redis.exceptions import RedisError

from inferq.shared import keys
from inferq.shared.lifecycle import scripts
from inferq.shared.models import ModelConfig, Ramp, Rollback, Rollout, one_line

log = logging.getLogger(__name__)

STATES = ("loading", "warming", "ready", "failed")


@dataclass(frozen=True)
class VersionState:
    state: str
    reason: str | None = None
    weights_sha256: str | None = None
    worker: str | None = None
    at: float | None = None
    ready_since: float | None = None  # when a worker first served it (a ramp counts from there)

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
            float(fields["ready_since"]) if fields.get("ready_since") else None,
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
            if state == "ready":
                pipe.hsetnx(key, "ready_since", fields["at"])
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


@dataclass(frozen=True)
class RolledBack:
    reason: str
    at: float | None
    weights_sha256: str | None


def judge(
    connection: Any, config: ModelConfig, outcomes: Sequence[tuple[bool, str]], weights: str | None, spread: bool
) -> str | None:
    """Add a batch's outcomes to its version's window; the reason when this rolled the version back, else None.

    ``outcomes``: per item the model ran (or failed on), whether it failed and its job's tenant; an item refused as
    bad input is not among them. ``spread`` (several tenants): the verdict must hold without any one tenant's jobs too.
    """
    rollback = config.rollback
    if rollback is None or not outcomes:
        return None
    fixed = [keys.outcomes_key(config.served), keys.rollback_key(config.served)]
    args = {
        "outcomes": [("1" if failed else "0") + tenant for failed, tenant in outcomes],
        "window": rollback.window,
        "max_rate": repr(rollback.max_failure_rate),
        "min_jobs": min(rollback.min_jobs, rollback.window),
        "spread": "1" if spread else "0",
        "ttl": keys.ROLLBACK_TTL_S,
        "model": config.name,
        "version": config.version,
        "weights": weights or "",
        "channel": keys.EVENTS_CHANNEL,
        "now": f"{time.time():.3f}",
    }
    verdict, reason = scripts.JUDGE(connection, fixed, args=args)
    return reason.decode() if int(verdict) else None


def roll_back(connection: Any, config: ModelConfig, reason: str, weights: str | None = None) -> bool:
    """Roll a version back at once (its warm-up failed on a new worker): True if this call did."""
    key = keys.rollback_key(config.served)
    try:
        if not connection.hsetnx(key, "reason", reason):
            return False
        with connection.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping={"at": f"{time.time():.3f}", "weights_sha256": weights or ""})
            pipe.expire(key, keys.ROLLBACK_TTL_S)
            event = {"id": "", "kind": "rollback", "model": config.name, "version": config.version, "reason": reason}
            pipe.publish(keys.EVENTS_CHANNEL, json.dumps(event))
            pipe.execute()
    except RedisError as exc:
        log.warning("model %s: could not record its rollback in Redis (%s)", config.served, exc)
        return False
    return True


def forget_rollback_of_other_weights(connection: Any, served: str, weights: str | None) -> bool:
    """A worker loaded ``weights``: a rollback judged on other weights no longer stands. True if one was lifted."""
    key = keys.rollback_key(served)
    try:
        judged = connection.hget(key, "weights_sha256")
        if judged is None or not weights or judged.decode() == weights:
            return False
        connection.delete(key, keys.outcomes_key(served))
    except RedisError as exc:
        log.warning("model %s: could not read its rollback in Redis (%s)", served, exc)
        return False
    return True


async def read_rollbacks(client: Any, served: Iterable[str]) -> dict[str, RolledBack | None]:
    """Each served name's standing rollback (None: none)."""
    names = list(served)
    reads = [cast(Awaitable[dict[bytes, bytes]], client.hgetall(keys.rollback_key(n))) for n in names]
    out: dict[str, RolledBack | None] = {}
    for name, raw in zip(names, await asyncio.gather(*reads), strict=True):
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        if "reason" not in fields:
            out[name] = None
            continue
        at = fields.get("at")
        out[name] = RolledBack(fields["reason"], float(at) if at else None, fields.get("weights_sha256") or None)
    return out


async def restore(client: Any, served: str) -> bool:
    """Lift a version's rollback and forget its window: True if one stood."""
    stood = await cast(Awaitable[int], client.exists(keys.rollback_key(served)))
    await cast(Awaitable[int], client.delete(keys.rollback_key(served), keys.outcomes_key(served)))
    return bool(stood)


@dataclass(frozen=True)
class RolloutSet:
    """A model's traffic and ramp as an operator set them through the API, over its config.json's, and when.

    ``unusable``: why the one stored cannot be used (written by another version of inferq, or out of the bounds
    checked before storing, as a ramp stored before they were); its traffic and ramp are then None and the config's
    hold, and the listing says so until DELETE clears it."""

    traffic: dict[int, float] | None
    ramp: Ramp | None
    at: float
    unusable: str | None = None

    def over(self, config: Rollout | None) -> Rollout:
        """The rollout submits follow: this traffic and ramp, the config's rollback (the workers judge by it)."""
        rollback = config.rollback if config is not None else Rollback()
        return Rollout(traffic=self.traffic, ramp=self.ramp, rollback=rollback)


async def set_rollout(client: Any, model: str, traffic: dict[int, float] | None, ramp: Ramp | None) -> RolloutSet:
    """Set a model's traffic and ramp for every API process (each reads it within a second)."""
    told = RolloutSet(traffic, ramp, time.time())
    value = {
        "traffic": None if traffic is None else {str(v): s for v, s in traffic.items()},
        "ramp": None if ramp is None else ramp.model_dump(mode="json"),
        "at": told.at,
    }
    await cast(Awaitable[Any], client.set(keys.rollout_key(model), json.dumps(value), ex=keys.ROLLOUT_TTL_S))
    return told


async def read_rollout(client: Any, model: str) -> RolloutSet | None:
    """The rollout set through the API for ``model`` (None: its config.json's holds), renewed for another TTL; one
    that cannot be used is ``unusable`` (logged once per value and process), never an error of the route."""
    raw = await cast(Awaitable[bytes | None], client.getex(keys.rollout_key(model), ex=keys.ROLLOUT_TTL_S))
    if raw is None:
        return None
    try:
        return parse_rollout(raw)
    except ValueError as exc:
        why = one_line(exc) if isinstance(exc, ValidationError) else str(exc)
        if _told_unusable.get(model) != raw:  # read on every routing refresh: said once, not every second
            _told_unusable[model] = raw
            log.warning(
                "model %s: its rollout set through the API cannot be used (%s); its config.json's holds until "
                "DELETE /v1/models/%s/rollout clears it",
                model,
                why,
                model,
            )
        return RolloutSet(None, None, 0.0, unusable=why)


# The unusable stored rollout last logged, by model.
_told_unusable: dict[str, bytes] = {}


def parse_rollout(raw: bytes) -> RolloutSet:
    """A stored rollout, checked as ``set_rollout`` checks one before storing it (ValueError naming what is wrong)."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict) or not isinstance(value.get("at"), int | float):
        raise ValueError("not a rollout: an object with traffic, ramp and at")
    at = float(value["at"])
    if not math.isfinite(at):
        raise ValueError(f"at: {at} is not a time")
    rollout = Rollout(traffic=value.get("traffic"), ramp=value.get("ramp"))
    return RolloutSet(rollout.traffic, rollout.ramp, at)


async def clear_rollout(client: Any, model: str) -> bool:
    """Go back to the model's config.json's traffic and ramp: True if a rollout set through the API stood."""
    return bool(await cast(Awaitable[int], client.delete(keys.rollout_key(model))))
