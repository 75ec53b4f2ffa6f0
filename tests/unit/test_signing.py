"""Standard Webhooks signatures."""

from __future__ import annotations

import time

from inferq.shared import signing

# The test vector published with the Standard Webhooks specification.
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
BODY = b'{"test": 2432232314}'
SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_sign_matches_the_spec_vector() -> None:
    assert signing.sign(SECRET, MSG_ID, TIMESTAMP, BODY) == SIGNATURE


def test_verify_accepts_fresh_and_rejects_tampered_or_stale() -> None:
    now = int(time.time())
    headers = signing.headers(SECRET, MSG_ID, BODY, timestamp=now)
    assert signing.verify(SECRET, headers, BODY)
    assert not signing.verify(SECRET, headers, BODY + b"x")
    assert not signing.verify("whsec_" + "QUFBQQ==", headers, BODY)
    stale = signing.headers(SECRET, MSG_ID, BODY, timestamp=now - 3600)
    assert not signing.verify(SECRET, stale, BODY)
    assert not signing.verify(SECRET, {}, BODY)


def test_no_secret_sends_no_signature() -> None:
    headers = signing.headers(None, MSG_ID, BODY)
    assert "webhook-signature" not in headers and headers["webhook-id"] == MSG_ID
