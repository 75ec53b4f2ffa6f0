"""The SDK's rules that need no server: webhook verification against the Standard Webhooks library, Retry-After."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
import standardwebhooks

from inferq.client import Retry, WebhookVerificationError, retry_after_s, verify_webhook
from shared import signing
from tests.stack import WEBHOOK_SECRET

BODY = json.dumps({"id": "abc", "model": "digits", "status": "finished", "result": {"label": "7"}}).encode()


def _library_headers(secret: str, msg_id: str, at: float, body: bytes = BODY) -> dict[str, str]:
    moment = datetime.fromtimestamp(at, UTC)
    signature = standardwebhooks.Webhook(secret).sign(msg_id, moment, body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(at)), "webhook-signature": signature}


def _library_accepts(secret: str, headers: dict[str, str], body: bytes) -> bool:
    try:
        standardwebhooks.Webhook(secret).verify(body, headers)
    except standardwebhooks.WebhookVerificationError:
        return False
    return True


def _ours_accepts(secret: str, headers: dict[str, str], body: bytes) -> bool:
    try:
        verify_webhook(secret, headers, body)
    except WebhookVerificationError:
        return False
    return True


def _cases() -> dict[str, tuple[str, dict[str, str], bytes]]:
    now = time.time()
    good = _library_headers(WEBHOOK_SECRET, "msg_abc", now)
    raw_secret = WEBHOOK_SECRET.removeprefix("whsec_")
    signatures = good["webhook-signature"]
    return {
        "signed by the library": (WEBHOOK_SECRET, good, BODY),
        "signed by inferq": (WEBHOOK_SECRET, signing.headers(WEBHOOK_SECRET, "msg_abc", BODY), BODY),
        "headers in another case": (WEBHOOK_SECRET, {k.title(): v for k, v in good.items()}, BODY),
        "secret without its prefix": (raw_secret, good, BODY),
        "one of several signatures": (WEBHOOK_SECRET, good | {"webhook-signature": f"v1,AAAA {signatures}"}, BODY),
        "another version's signature": (WEBHOOK_SECRET, good | {"webhook-signature": "v2" + signatures[2:]}, BODY),
        "a changed body": (WEBHOOK_SECRET, good, BODY.replace(b"7", b"1")),
        "another id": (WEBHOOK_SECRET, good | {"webhook-id": "msg_other"}, BODY),
        "another secret": ("whsec_" + base64.b64encode(b"another secret").decode(), good, BODY),
        "six minutes old": (WEBHOOK_SECRET, _library_headers(WEBHOOK_SECRET, "m", now - 360), BODY),
        "six minutes ahead": (WEBHOOK_SECRET, _library_headers(WEBHOOK_SECRET, "m", now + 360), BODY),
        "four minutes old": (WEBHOOK_SECRET, _library_headers(WEBHOOK_SECRET, "m", now - 240), BODY),
        "no signature": (WEBHOOK_SECRET, {k: v for k, v in good.items() if k != "webhook-signature"}, BODY),
        "a timestamp that is not one": (WEBHOOK_SECRET, good | {"webhook-timestamp": "soon"}, BODY),
    }


ACCEPTED = {
    "signed by the library",
    "signed by inferq",
    "headers in another case",
    "secret without its prefix",
    "one of several signatures",
    "four minutes old",
}


@pytest.mark.parametrize("case", sorted(_cases()))
def test_verify_webhook_agrees_with_the_standard_webhooks_library(case: str) -> None:
    secret, headers, body = _cases()[case]
    assert _library_accepts(secret, headers, body) == (case in ACCEPTED)
    assert _ours_accepts(secret, headers, body) == (case in ACCEPTED)


def test_verify_webhook_returns_the_job() -> None:
    headers = signing.headers(WEBHOOK_SECRET, "msg_abc", BODY)
    job = verify_webhook(WEBHOOK_SECRET, headers, BODY)
    assert (job.id, job.status, job.result) == ("abc", "finished", {"label": "7"})


def test_retry_after_is_read_as_seconds_or_a_date() -> None:
    assert retry_after_s("3") == 3.0
    assert retry_after_s(None) is None and retry_after_s("soon") is None
    in_a_minute = format_datetime(datetime.fromtimestamp(time.time() + 60, UTC), usegmt=True)
    assert 55 <= (retry_after_s(in_a_minute) or 0) <= 60


def test_retries_wait_at_least_retry_after_and_give_up_past_the_cap() -> None:
    retry = Retry(attempts=4, backoff_s=0.1, max_delay_s=10)
    assert all((retry.delay_s(1, "3") or 0) >= 3 for _ in range(20))
    assert retry.delay_s(1, "11") is None  # longer than the caller would wait: the error reaches the caller
    assert all(0.05 <= (retry.delay_s(attempt) or 0) <= 0.1 * 2 ** (attempt - 1) for attempt in (1, 2, 3))
