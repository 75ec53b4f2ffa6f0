"""The SDK's rules that need no server: webhook verification against the Standard Webhooks library, Retry-After,
what an upload and a batch's JSONL are made of, and views that turn back into the API's JSON."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path

import pytest
import standardwebhooks

from inferq.client import BatchResult, Job, Retry, WebhookVerificationError, retry_after_s, verify_webhook
from inferq.client_http import jsonl, upload
from inferq.shared import signing
from tests.support.webhooks import WEBHOOK_SECRET

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
    assert retry_after_s("²") is None and retry_after_s("٣") is None  # digits to str.isdigit(), not to HTTP
    in_a_minute = format_datetime(datetime.fromtimestamp(time.time() + 60, UTC), usegmt=True)
    assert 55 <= (retry_after_s(in_a_minute) or 0) <= 60


def test_retries_wait_at_least_retry_after_and_give_up_past_the_cap() -> None:
    retry = Retry(attempts=4, backoff_s=0.1, max_delay_s=10)
    assert all((retry.delay_s(1, "3") or 0) >= 3 for _ in range(20))
    assert retry.delay_s(1, "11") is None  # longer than the caller would wait: the error reaches the caller
    assert all(0.05 <= (retry.delay_s(attempt) or 0) <= 0.1 * 2 ** (attempt - 1) for attempt in (1, 2, 3))


def test_an_upload_may_be_a_name_and_bytes_as_httpx_takes_files() -> None:
    assert upload(("note.txt", b"hi")) == ("note.txt", b"hi", "text/plain")
    assert upload(("digit", b"\x89PNG", "image/png")) == ("digit", b"\x89PNG", "image/png")
    assert upload(("blob", bytearray(b"x"))) == ("blob", b"x", "application/octet-stream")
    with pytest.raises(TypeError):
        upload(("name", "not bytes"))


def test_a_batch_is_a_jsonl_file_as_it_is_or_one_line_per_item(tmp_path: Path) -> None:
    source = tmp_path / "items.jsonl"
    source.write_bytes(b'{"custom_id": "a", "inputs": 1}\n{"custom_id": "b", "inputs": 2}')
    assert jsonl(source) == source.read_bytes() + b"\n"
    assert jsonl(str(source)) == jsonl(source)
    lines = [{"custom_id": "a", "inputs": [1, 2]}, '{"custom_id": "b"}\n', b'{"custom_id": "c"}\r\n']
    assert jsonl(lines) == b'{"custom_id":"a","inputs":[1,2]}\n{"custom_id": "b"}\n{"custom_id": "c"}\n'
    assert jsonl(iter([])) == b""
    for wrong in ({"custom_id": "a"}, b'{"custom_id": "a"}', [3]):
        with pytest.raises(TypeError):
            jsonl(wrong)


def test_views_turn_back_into_the_apis_json() -> None:
    view = {
        "id": "j1",
        "model": "digits",
        "status": "finished",
        "created_at": "2026-01-02T03:04:05.123456Z",
        "enqueued_at": "2026-01-02T03:04:05Z",
        "started_at": None,
        "ended_at": "2026-01-02T03:04:06.5Z",
        "batch_size": 3,
        "worker": "w",
        "timings_ms": {"inference_ms": 1.5},
        "result": {"label": "7"},
        "error": None,
        "expires_at": "2026-01-03T03:04:06.500000Z",
        "webhook": {"url": "https://example.com/h", "attempts": [{"attempt": 1, "status_code": 204}]},
        "urls": None,
    }
    job = Job.from_dict(view)
    data = job.to_dict()
    assert data["created_at"] == view["created_at"] and data["ended_at"] == "2026-01-02T03:04:06.500000Z"
    assert data["webhook"]["attempts"][0] == {
        "attempt": 1,
        "at": None,
        "status_code": 204,
        "response_bytes": None,
        "error": None,
        "outcome": None,
        "next_attempt_in_s": None,
    }
    assert Job.from_dict(data) == job and json.loads(json.dumps(data)) == data
    for line in (
        {"custom_id": "a", "status": "finished", "result": None},
        {"custom_id": "b", "status": "failed", "error": "e"},
    ):
        assert BatchResult.from_dict(line).to_dict() == line
