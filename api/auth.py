"""Optional API keys: ``Authorization: Bearer <key>`` on every route but those in ``OPEN_PATHS``."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from fastapi import Depends, Header, Request

from inferq.api.deps import state_of
from inferq.shared.errors import Unauthorized
from inferq.shared.tenants import ANYONE, Tenant

# The routes anyone may call although INFERQ_API_KEYS is set ("/*": a folder of files): health and the protocol's
# server metadata, the docs, /metrics (counts only: no job ids, inputs or results) and the status page's own
# files (no data: the page reads /v1/status with the key its user enters). The start-up line names them.
OPEN_PATHS = (
    "/healthz",
    "/readyz",
    "/v2/health/live",
    "/v2/health/ready",
    "/v2",
    "/metrics",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
    "/openapi.json",
    "/static-offline-docs/*",
    "/",
    "/static/*",
)


def owner_of(key: str) -> str:
    """What a job records of the key that created it: never the key itself."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def caller(request: Request, authorization: str | None) -> Tenant:
    """The tenant whose key the request carries (the one open tenant when no keys are configured); 401 otherwise.
    Kept on the request (``tenant_of``) for the routes that count its quotas."""
    # The request, not the State dependency: a nested dependency costs FastAPI a solve of its own per request.
    tenants = state_of(request).tenants
    if not tenants.required:
        tenant = ANYONE
    else:
        scheme, _, given = (authorization or "").partition(" ")
        found = tenants.of_key(given) if scheme.lower() == "bearer" and given else None
        if found is None:
            raise Unauthorized("a valid API key is required: Authorization: Bearer <key>")
        tenant = found
    request.state.tenant = tenant
    return tenant


def tenant_of(request: Request) -> Tenant:
    """The tenant ``caller`` found for this request (every route that reaches here checked its key first)."""
    return getattr(request.state, "tenant", None) or ANYONE


def fair_order_of(request: Request) -> dict[str, Any]:
    """Where a submit or upload is queued among the tenants': its tenant's name, and its weight in the fair order
    when the deployment has several tenants (else at the tail, as with none)."""
    tenant = tenant_of(request)
    return {"tenant": tenant.name, "fair": len(state_of(request).tenants.all) > 1, "weight": tenant.weight}


def submitted_by(request: Request) -> dict[str, Any]:
    """What a submit records of its tenant: its place in the fair order and its quotas."""
    quotas = tenant_of(request).quotas
    return fair_order_of(request) | {"jobs_per_minute": quotas.jobs_per_minute, "in_flight": quotas.in_flight}


async def require_key(
    request: Request, authorization: Annotated[str | None, Header(include_in_schema=False)] = None
) -> str | None:
    """The caller's owner id (what its jobs record), or None when no keys are configured; 401 otherwise."""
    return caller(request, authorization).owner


async def require_tenant(
    request: Request, authorization: Annotated[str | None, Header(include_in_schema=False)] = None
) -> Tenant:
    """The caller's tenant; 401 without a valid key when keys are configured."""
    return caller(request, authorization)


Owner = Annotated[str | None, Depends(require_key)]
Caller = Annotated[Tenant, Depends(require_tenant)]
