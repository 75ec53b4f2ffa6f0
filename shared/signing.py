"""Standard Webhooks signatures (https://www.standardwebhooks.com): sign and verify."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

SECRET_PREFIX = "whsec_"


def secret_bytes(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret looks like whsec_<base64>")
    return base64.b64decode(secret[len(SECRET_PREFIX) :])


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: ``v1,<base64 HMAC-SHA256 of id.timestamp.body>``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str | None, msg_id: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """The Standard Webhooks headers for one delivery attempt."""
    ts = int(time.time()) if timestamp is None else timestamp
    out = {"webhook-id": msg_id, "webhook-timestamp": str(ts), "content-type": "application/json"}
    if secret:
        out["webhook-signature"] = sign(secret, msg_id, ts, body)
    return out


def verify(secret: str, headers_in: dict[str, str], body: bytes, tolerance_s: int = 300) -> bool:
    """True when one of the header's signatures matches and the timestamp is fresh."""
    lowered = {k.lower(): v for k, v in headers_in.items()}
    try:
        msg_id = lowered["webhook-id"]
        ts = int(lowered["webhook-timestamp"])
        given = lowered["webhook-signature"].split()
    except (KeyError, ValueError):
        return False
    if abs(time.time() - ts) > tolerance_s:
        return False
    expected = sign(secret, msg_id, ts, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in given)
