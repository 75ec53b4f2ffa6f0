"""Optional API keys: ``Authorization: Bearer <key>`` on every route but those in ``OPEN_PATHS``."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Header, Request

from inferq.api.deps import state_of
from inferq.shared.errors import Unauthorized

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


async def require_key(
    request: Request, authorization: Annotated[str | None, Header(include_in_schema=False)] = None
) -> str | None:
    """The caller's owner id, or None when no keys are configured; 401 otherwise."""
    # The request, not the State dependency: a nested dependency costs FastAPI a solve of its own per request.
    keys = state_of(request).settings.api_keys
    if not keys:
        return None
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and given:
        # Compare against every key, in constant time each, so timing tells nothing.
        matches = [hmac.compare_digest(given.encode(), key.encode()) for key in keys]
        if any(matches):
            return owner_of(given)
    raise Unauthorized("a valid API key is required: Authorization: Bearer <key>")


Owner = Annotated[str | None, Depends(require_key)]
