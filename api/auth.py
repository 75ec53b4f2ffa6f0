"""Optional API keys: ``Authorization: Bearer <key>`` on every route but health and docs."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Header, Request

from api.deps import state_of
from shared.errors import Unauthorized


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
