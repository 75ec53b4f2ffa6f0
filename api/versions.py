"""Which version of a model a submit goes to: the one it pins, else one chosen by the model's traffic shares among
the versions that are serving.

A version serves once a worker registered on its queue (RQ's worker registry): a worker registers only after its
model loaded and passed its warm-up, so a version that fails either never gets an unpinned job. Without a
``rollout.traffic`` in the model's config (or set through the API, ``PUT /v1/models/{m}/rollout``, which stands
over the config's), the highest serving version takes every unpinned submit (Triton's
"latest" policy); with one, the serving versions share them in proportion. When no version serves (a cold start),
the shares as configured decide, and the jobs wait in that version's queue for its worker.

The split is exact without any shared state: the n-th unpinned submit of a model in this process goes to the
version whose share the point ``frac(n x golden ratio)`` falls in. That sequence is spread as evenly as any over
[0, 1), so after n submits each version's count is within a few jobs of n x its share (not the binomial spread
of a random choice), in every API process alike.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Literal, cast

from inferq.shared import keys
from inferq.shared.errors import NotFound
from inferq.shared.lifecycle import census, layout
from inferq.shared.models import ModelConfig, ModelRepository, Rollout
from inferq.shared.versions import RolledBack, VersionState, read_rollbacks, read_rollout, read_states

# How long a read of which versions serve is reused: a new worker takes traffic within this, plus its start.
LIVE_CACHE_S = 1.0
GOLDEN = (math.sqrt(5) - 1) / 2


def pick(shares: dict[int, float], n: int) -> int:
    """The version the n-th submit goes to (``shares`` > 0, any scale): the low-discrepancy sequence's n-th point."""
    point = (n * GOLDEN) % 1.0
    total = sum(shares.values())
    edge = 0.0
    for version, share in sorted(shares.items()):
        edge += share / total
        if point < edge:
            return version
    return max(shares)


def shares_of(
    versions: dict[int, ModelConfig],
    serving: set[int],
    rolled_back: AbstractSet[int] = frozenset(),
    ramped_for_s: float | None = None,
    rollout: Rollout | None | Literal["config"] = "config",
) -> dict[int, float]:
    """The shares unpinned submits follow: the traffic of ``rollout`` (by default the model's config.json's) among the
    serving versions (all of them when none serves); without traffic, the highest serving version (the highest of
    all when none serves). A rolled-back version counts as not serving while another serves (with none left, the
    rollbacks are set aside). A ramped version, once it serves, takes its step's share (``ramped_for_s``: since
    its ramp started) and the others share the rest; until then it takes none."""
    if rollout == "config":
        rollout = versions[max(versions)].rollout  # the model's own config.json's: every version's config carries it
    traffic = rollout.traffic if rollout is not None else None
    ramp = rollout.ramp if rollout is not None else None
    usable = (serving - rolled_back) or serving
    if ramp is None or ramp.version not in versions or len(versions) == 1:
        return _shares(versions, traffic, usable, rolled_back)
    others = {v: c for v, c in versions.items() if v != ramp.version}
    rest = _shares(others, traffic, usable - {ramp.version}, rolled_back)
    if ramp.version not in usable or ramped_for_s is None:
        return rest
    share = ramp.share(ramped_for_s)
    if share >= 1.0 or not usable - {ramp.version}:
        return {ramp.version: 1.0}
    total = sum(rest.values())
    shares = {v: (1.0 - share) * s / total for v, s in rest.items()}
    return {ramp.version: share, **shares} if share > 0 else shares


@dataclass(frozen=True)
class Routing:
    """What a model's unpinned submits follow now, as read from Redis (``read_routing``)."""

    rollout: Rollout | None
    set_by: Literal["config", "api"]  # the model's config.json, or an operator through PUT /v1/models/{m}/rollout
    told: dict[int, VersionState | None]
    rolled_back: dict[int, RolledBack]
    ramp_since: float | None  # when its ramp started counting: its version first served, or (set later) was set
    # Why the rollout stored through the API cannot be used (the config's holds meanwhile), or None.
    unusable: str | None = None

    def shares(self, versions: dict[int, ModelConfig], serving: set[int]) -> dict[int, float]:
        since = None if self.ramp_since is None else time.time() - self.ramp_since
        return shares_of(versions, serving, set(self.rolled_back), since, self.rollout)


# A model with no version served (every one removed, some still draining): no rollout, nothing told.
NO_ROUTING = Routing(None, "config", {}, {}, None)


async def read_routing(client: Any, model: str, versions: dict[int, ModelConfig]) -> Routing:
    """A model's rollout (the one set through the API over its config.json's), its versions' told states and
    standing rollbacks, and when its ramp started: one round trip on the API's auto-pipelined client."""
    served = [c.served for c in versions.values()]
    told, rollbacks, override = await asyncio.gather(
        read_states(client, served), read_rollbacks(client, served), read_rollout(client, model)
    )
    configured = versions[max(versions)].rollout
    unusable = override.unusable if override is not None else None
    if unusable is not None:
        override = None
    rollout = configured if override is None else override.over(configured)
    ramp = rollout.ramp if rollout is not None else None
    since = None
    if ramp is not None and ramp.version in versions:
        state = told[versions[ramp.version].served]
        since = state.ready_since if state is not None else None
        if since is not None and override is not None and override.ramp is not None:
            since = max(since, override.at)  # a ramp set while its version served counts from when it was set
    return Routing(
        rollout,
        "config" if override is None else "api",
        {v: told[c.served] for v, c in versions.items()},
        {v: r for v, c in versions.items() if (r := rollbacks[c.served]) is not None},
        since,
        unusable,
    )


def _shares(
    versions: dict[int, ModelConfig], traffic: dict[int, float] | None, usable: set[int], rolled_back: AbstractSet[int]
) -> dict[int, float]:
    if traffic is None:
        return {max(usable or (set(versions) - rolled_back) or set(versions)): 1.0}
    known = {v: s for v, s in traffic.items() if v in versions and s > 0}
    live = {v: s for v, s in known.items() if v in usable}
    if live:
        return live
    if usable:  # the configured versions all down: a serving one rather than jobs that wait
        return {max(usable): 1.0}
    return {v: s for v, s in known.items() if v not in rolled_back} or known or {max(versions): 1.0}


class VersionRouter:
    """One API process's routing of submits to versions."""

    def __init__(self, repository: ModelRepository, live_within_s: float = 30.0) -> None:
        self.repository = repository
        # A worker is live while its last heartbeat is this recent (INFERQ_WORKER_TTL_S).
        self.live_within_s = live_within_s
        self._versions = {name: repository.versions(name) for name in repository.models()}
        self._submits: dict[str, int] = {}
        # model -> (read at, versions serving, its routing)
        self._serving: dict[str, tuple[float, set[int], Routing]] = {}

    def versions(self, model: str) -> dict[int, ModelConfig]:
        return self._versions.get(model, {})

    async def route(self, client: Any, model: str, pinned: int | None) -> ModelConfig:
        """The config of the version a submit to ``model`` runs on."""
        versions = self.versions(model)
        if pinned is not None:
            if pinned not in versions:
                served = ", ".join(map(str, versions)) or "none"
                raise NotFound(f"model {model!r} has no version {pinned} (it has: {served})")
            return versions[pinned]
        if len(versions) == 1:
            return next(iter(versions.values()))
        serving, routing = await self.serving(client, model)
        shares = routing.shares(versions, serving)
        if len(shares) == 1:
            return versions[next(iter(shares))]
        n = self._submits[model] = self._submits.get(model, 0) + 1
        return versions[pick(shares, n)]

    async def serving(self, client: Any, model: str) -> tuple[set[int], Routing]:
        """The versions of ``model`` with a live worker, and its routing, as read at most LIVE_CACHE_S ago (or since
        the last rollback or rollout change, ``forget``)."""
        now = time.monotonic()
        cached = self._serving.get(model)
        if cached is not None and now - cached[0] < LIVE_CACHE_S:
            return cached[1], cached[2]
        versions = self.versions(model)
        counts, routing = await asyncio.gather(
            asyncio.gather(
                *(live_workers_async(client, keys.queue_name(c.served), self.live_within_s) for c in versions.values())
            ),
            read_routing(client, model, versions),
        )
        live = {v for v, count in zip(versions, counts, strict=True) if count}
        self._serving[model] = (now, live, routing)
        return live, routing

    def forget(self, model: str) -> None:
        """Read ``model``'s versions afresh on its next submit (a version of it was just rolled back, or its rollout
        set)."""
        self._serving.pop(model, None)


async def live_workers_async(client: Any, queue_name: str, within_s: float) -> int:
    """How many workers RQ lists on a queue that sent a heartbeat within ``within_s`` (a killed one's entry lingers
    until RQ's maintenance cleans it, and its hash a minute past its last heartbeat)."""
    names = await cast(Awaitable[set[bytes]], client.smembers(layout.workers_key(queue_name)))
    if not names:
        return 0
    beats = await asyncio.gather(*(cast(Awaitable[bytes | None], client.hget(n, census.HEARTBEAT)) for n in names))
    return census.live_count(beats, within_s)
