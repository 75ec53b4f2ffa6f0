"""Optional API keys: ``Authorization: Bearer <key>`` on every route but those in ``OPEN_PATHS``; and who is an
operator.

With keys on, each key is a tenant's, and sees and changes only its own jobs, batches and figures; an operator's
(``"operator": true`` in INFERQ_TENANTS) may also change what every tenant gets (``require_operator``: a model's
rollout, a version's restore, a reload of the repository) and see every tenant (``may_operate``: the status page's
tenants and failures, /metrics' tenant label). With keys off, anyone who reaches the API is the operator: it must
then not be exposed (docs/operating.md).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Header, Request

from inferq.shared.errors import Forbidden, Unauthorized
from inferq.shared.tenants import ANYONE, Tenant, Tenants

if TYPE_CHECKING:  # api.deps builds its model dependencies on this module's Owner: no import back at run time
    from inferq.api.deps import AppState

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


def _tenants(request: Request) -> Tenants:
    # The request, not the State dependency: a nested dependency costs FastAPI a solve of its own per request.
    state: AppState = request.app.state.inferq
    return state.tenants


def _bearer(tenants: Tenants, authorization: str | None) -> Tenant | None:
    """The tenant whose key ``Authorization: Bearer <key>`` carries, or None."""
    scheme, _, given = (authorization or "").partition(" ")
    return tenants.of_key(given) if scheme.lower() == "bearer" and given else None


def caller(request: Request, authorization: str | None) -> Tenant:
    """The tenant whose key the request carries (the one open tenant when no keys are configured); 401 otherwise.
    Kept on the request (``tenant_of``) for the routes that count its quotas."""
    tenants = _tenants(request)
    if not tenants.required:
        tenant = ANYONE
    else:
        found = _bearer(tenants, authorization)
        if found is None:
            raise Unauthorized("a valid API key is required: Authorization: Bearer <key>")
        tenant = found
    request.state.tenant = tenant
    return tenant


def may_operate(request: Request, tenant: Tenant) -> bool:
    """Whether ``tenant`` (the caller) may change every tenant's service and see every tenant: an operator's key, or
    anyone when no keys are configured."""
    return tenant.operator or not _tenants(request).required


def names_tenants(request: Request) -> bool:
    """On an open route (/metrics): whether the answer may name the tenants. With keys off, or an operator's key;
    with none, an unknown one or a tenant's own, it may not (a scrape needs no key, and sees the cluster whole)."""
    tenants = _tenants(request)
    if not tenants.required:
        return True
    found = _bearer(tenants, request.headers.get("authorization"))
    return found is not None and found.operator


def tenant_of(request: Request) -> Tenant:
    """The tenant ``caller`` found for this request (every route that reaches here checked its key first)."""
    return getattr(request.state, "tenant", None) or ANYONE


def fair_order_of(request: Request) -> dict[str, Any]:
    """Where a submit or upload is queued among the tenants': its tenant's name, and its weight in the fair order
    when the deployment has several tenants (else at the tail, as with none)."""
    tenant = tenant_of(request)
    return {"tenant": tenant.name, "fair": len(_tenants(request).all) > 1, "weight": tenant.weight}


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


async def require_operator(
    request: Request, authorization: Annotated[str | None, Header(include_in_schema=False)] = None
) -> Tenant:
    """The caller's tenant if it may change what every tenant gets (``may_operate``); 401 without a valid key, 403
    with a tenant's own."""
    tenant = caller(request, authorization)
    if not may_operate(request, tenant):
        raise Forbidden(
            f"tenant {tenant.name} may not do this: a model's rollout, a version's restore and a reload of the models"
            ' change what every tenant gets, and need an operator\'s key (a tenant with "operator": true in'
            " INFERQ_TENANTS)"
        )
    return tenant


Owner = Annotated[str | None, Depends(require_key)]
Caller = Annotated[Tenant, Depends(require_tenant)]
# A route that changes every tenant's routing or service: ``dependencies=OPERATOR_ONLY``.
OPERATOR_ONLY = [Depends(require_operator)]
