"""An Idempotency-Key covers the whole submit: input and options (httpx.ASGITransport, real redis-server)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_py

from inferq.api.app import create_app
from inferq.shared import keys
from inferq.shared.jobs import Submission
from inferq.shared.rqjson import JSONJob
from inferq.shared.settings import Settings
from tests.support.asgi import call_api

QUEUE = f"rq:queue:{keys.queue_name('pair')}"
HOOK = "http://127.0.0.1:9/hook"
BODY = {"inputs": [1, 2], "webhook": HOOK, "result_ttl": 60, "ttl": 30}
REFUSED = {"error": {"code": "invalid_input", "message": "this Idempotency-Key was used with a different request body"}}


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    config = {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2]}}
    (tmp_path / "pair").mkdir()
    (tmp_path / "pair" / "config.json").write_text(json.dumps(config))
    return Settings(redis_url=redis_url, models_dir=tmp_path, webhook_allow=["127.0.0.1"])


def submit_twice(settings: Settings, first: dict[str, Any], second: dict[str, Any]) -> list[httpx.Response]:
    """Both submits under one Idempotency-Key, through one app."""

    async def run() -> list[httpx.Response]:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://inferq") as client:
                headers = {"Idempotency-Key": "order-17"}
                return [
                    await client.post("/v1/models/pair/jobs", json=body, headers=headers) for body in (first, second)
                ]

    return asyncio.run(run())


def test_the_same_key_and_body_return_the_same_job(settings: Settings, redis: redis_py.Redis) -> None:
    first, again = submit_twice(settings, BODY, dict(reversed(BODY.items())))
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json()["id"] == first.json()["id"]
    assert redis.lrange(QUEUE, 0, -1) == [first.json()["id"].encode()]


@pytest.mark.parametrize(
    "change",
    [
        {"inputs": [3, 4]},
        {"webhook": "http://127.0.0.1:9/other-hook"},
        {"webhook": None},
        {"result_ttl": 61},
        {"result_ttl": None},
        {"ttl": 31},
        {"ttl": None},
    ],
)
def test_the_same_key_with_another_input_or_option_is_refused(
    settings: Settings, redis: redis_py.Redis, change: dict[str, Any]
) -> None:
    other = {k: v for k, v in (BODY | change).items() if v is not None}
    first, second = submit_twice(settings, BODY, other)
    assert first.status_code == 202, first.text
    assert (second.status_code, second.json()) == (422, REFUSED)
    job_id = first.json()["id"]
    assert redis.lrange(QUEUE, 0, -1) == [job_id.encode()]
    assert redis.keys(keys.payload_key("*")) == [keys.payload_key(job_id).encode()]
    # The first job keeps what it was submitted with: nothing of the second request leaked into it.
    assert redis.hget(keys.info_key(job_id), "webhook") == HOOK.encode()
    # The result TTL the worker applies is RQ's own field (the info hash's copy was never read and is gone).
    assert redis.hget(JSONJob.key_for(job_id), "result_ttl") == b"60"


def test_the_fingerprint_covers_every_option_the_client_chose() -> None:
    base = Submission("pair", b'{"inputs": [1, 2]}', "application/json", webhook=HOOK, result_ttl_s=60, queue_ttl_s=30)
    variants = [
        Submission("other", base.payload, base.content_type, webhook=HOOK, result_ttl_s=60, queue_ttl_s=30),
        Submission("pair", b'{"inputs": [1, 3]}', base.content_type, webhook=HOOK, result_ttl_s=60, queue_ttl_s=30),
        Submission("pair", base.payload, "text/plain; charset=utf-8", webhook=HOOK, result_ttl_s=60, queue_ttl_s=30),
        Submission("pair", base.payload, base.content_type, webhook=None, result_ttl_s=60, queue_ttl_s=30),
        Submission("pair", base.payload, base.content_type, webhook=HOOK, result_ttl_s=None, queue_ttl_s=30),
        Submission("pair", base.payload, base.content_type, webhook=HOOK, result_ttl_s=60, queue_ttl_s=None),
    ]
    assert len({base.fingerprint, *(v.fingerprint for v in variants)}) == 1 + len(variants)
    # What the API adds from the model's config or the caller's key is no part of the body.
    server_side = Submission(
        **{**base.__dict__, "retries": 5, "max_queue_length": 9, "owner": "o", "idempotency_key": "k"}
    )
    assert server_side.fingerprint == base.fingerprint


@pytest.fixture
def versioned(tmp_path: Path, redis_url: str) -> Settings:
    """Model 'pair' in versions 1 and 2, sharing its unpinned submits half and half (with no worker, as configured:
    api/versions.py routes them by turns)."""
    config = {
        "handler": "tests.support.echo:SlowEcho",
        "weights": "none",
        "input": {"kind": "tensor", "shape": [2]},
        "rollout": {"traffic": {"1": 50, "2": 50}},
    }
    for folder in ("pair/1", "pair/2"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "pair" / "config.json").write_text(json.dumps(config))
    return Settings(redis_url=redis_url, models_dir=tmp_path)


LINES = b'{"custom_id": "a", "inputs": [1, 2]}\n{"custom_id": "b", "inputs": [3, 4]}\n'


def _uploads(settings: Settings, *versions: int | None) -> list[httpx.Response]:
    """The same JSONL body under one Idempotency-Key, once per ``versions`` (None: unpinned)."""
    headers = {"Idempotency-Key": "upload-9", "content-type": "application/jsonl"}
    return call_api(
        settings,
        *(
            ("POST", "/v1/models/pair/batches", {"content": LINES, "headers": headers, "params": _pin(version)})
            for version in versions
        ),
    )


def _pin(version: int | None) -> dict[str, int]:
    return {} if version is None else {"version": version}


def test_an_uploads_key_with_another_version_is_refused_as_a_single_submits_is(
    versioned: Settings, redis: redis_py.Redis
) -> None:
    """The upload's fingerprint held the model's name, not the version: a replay pinned to version 2 silently
    returned the batch queued for version 1."""
    first, other = _uploads(versioned, 1, 2)
    assert first.status_code == 202, first.text
    assert (other.status_code, other.json()) == (422, REFUSED)
    assert redis.llen("rq:queue:inferq.pair.bulk") == 1 and redis.llen("rq:queue:inferq.pair@2.bulk") == 0
    single = call_api(
        versioned,
        *(
            (
                "POST",
                "/v1/models/pair/jobs",
                {"json": {"inputs": [1, 2]}, "headers": {"Idempotency-Key": "k"}, "params": _pin(v)},
            )
            for v in (1, 2)
        ),
    )
    assert [r.status_code for r in single] == [202, 422] and single[1].json() == REFUSED


def test_an_unpinned_retry_returns_the_same_job_or_batch_whichever_version_routing_takes_next(
    versioned: Settings, redis: redis_py.Redis
) -> None:
    """A single submit's fingerprint held the version routing chose: a client's retry of an unpinned submit under
    a 50/50 rollout was routed to the other version and answered 422 (as the SDK's retry of a lost answer is)."""
    headers = {"Idempotency-Key": "order-18"}
    first, again = call_api(
        versioned, *(("POST", "/v1/models/pair/jobs", {"json": {"inputs": [1, 2]}, "headers": headers}),) * 2
    )
    assert (first.status_code, again.status_code) == (202, 202), again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["version"] == first.json()["version"]
    queued = redis.llen("rq:queue:inferq.pair") + redis.llen("rq:queue:inferq.pair@2")
    assert queued == 1
    upload, retried = _uploads(versioned, None, None)
    assert (upload.status_code, retried.status_code) == (202, 202), retried.text
    assert retried.json()["id"] == upload.json()["id"]
