"""What a client may learn of its own tenant: its name, weight, quotas and their use now (never another's)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, cast

from fastapi import APIRouter
from pydantic import BaseModel, Field

from inferq.api.auth import Caller
from inferq.api.deps import AppState, State
from inferq.api.schemas import ERRORS
from inferq.shared import keys
from inferq.shared.jobs import drop_ended_in_flight_async
from inferq.shared.lifecycle.bulk import recount_bulk_lines_async
from inferq.shared.tenants import Quotas, Tenant

router = APIRouter(prefix="/v1/tenants", tags=["tenants"])


class RateUse(BaseModel):
    limit: int
    used: int = Field(description="jobs counted against the quota now: it refuses once this reaches the limit")
    retry_after_s: int = Field(description="seconds until a submit is taken again (0: now)")


class CountUse(BaseModel):
    limit: int
    used: int = Field(description="jobs submitted and not yet ended: a submit is refused once this reaches the limit")


class LinesUse(BaseModel):
    limit: int
    used: int = Field(description="lines of its uploads still waiting: an upload is refused past the limit")


class TenantUse(BaseModel):
    jobs_per_minute: RateUse | None = None
    in_flight: CountUse | None = None
    bulk_lines: LinesUse | None = None


class TenantView(BaseModel):
    name: str
    weight: float = Field(description="its share of each model's batches against the other tenants' waiting jobs")
    quotas: Quotas
    use: TenantUse


async def _rate_use(client: Any, tenant: str, per_minute: int) -> RateUse:
    """The generic cell rate algorithm's state (lua/enqueue.lua) as a count: how much of the burst is spent."""
    now, tat = await asyncio.gather(client.time(), client.get(keys.tenant_rate_key(tenant)))
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    interval = 60_000 / per_minute
    ahead = max(0.0, float(cast(bytes, tat)) - now_ms) if tat else 0.0
    used = min(per_minute, math.ceil(ahead / interval - 1e-9))
    wait_ms = max(0.0, ahead + interval - 60_000)
    return RateUse(limit=per_minute, used=used, retry_after_s=math.ceil(wait_ms / 1000))


@router.get("/me", response_model=TenantView, responses=ERRORS)
async def me(tenant: Caller, state: State) -> TenantView:
    """The tenant the request's API key belongs to: its name, weight, quotas and what it uses of them now. (With
    several Redis shards a quota holds on each; the one nearest to its limit is shown.)"""
    return TenantView(name=tenant.name, weight=tenant.weight, quotas=tenant.quotas, use=await use_of(state, tenant))


async def use_of(state: AppState, tenant: Tenant) -> TenantUse:
    """What ``tenant`` uses of its quotas now, on the shard nearest to each limit."""
    use = TenantUse()
    shards = list(state.shards.values())
    per_minute = tenant.quotas.jobs_per_minute
    if per_minute is not None:
        reads = [_rate_use(shard.aredis, tenant.name, per_minute) for shard in shards]
        use.jobs_per_minute = max(await asyncio.gather(*reads), key=lambda r: (r.used, r.retry_after_s))
    in_flight = tenant.quotas.in_flight
    if in_flight is not None:
        counts = [_in_flight(shard.aredis, tenant.name) for shard in shards]
        use.in_flight = CountUse(limit=in_flight, used=max(await asyncio.gather(*counts)))
    bulk_lines = tenant.quotas.bulk_lines
    if bulk_lines is not None:
        lines = [recount_bulk_lines_async(shard.aredis, tenant.name) for shard in shards]
        use.bulk_lines = LinesUse(limit=bulk_lines, used=max(await asyncio.gather(*lines)))
    return use


async def _in_flight(client: Any, tenant: str) -> int:
    """The tenant's jobs not yet ended: the count the submit script keeps, less the ones that ended sooner."""
    await drop_ended_in_flight_async(client, tenant)
    now_ms = int(time.time() * 1000)
    return int(await client.zcount(keys.tenant_in_flight_key(tenant), now_ms, "+inf"))
