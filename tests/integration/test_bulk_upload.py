"""How an upload is written in steps (shared/lifecycle/upload.py): read a slice of lines at a time, staged
unqueued, hidden while its chunks are queued; an upload that dies at any step leaves nothing queued that cannot
end and no key without a TTL (real redis-server, the API through httpx.ASGITransport, in-process workers)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from redis.asyncio import Redis as AsyncRedis

from inferq.api import bulk_upload
from inferq.api.routers import batches
from inferq.shared import keys
from inferq.shared.jobs import new_job_id
from inferq.shared.lifecycle import bulk, bulk_scripts, upload
from inferq.shared.lifecycle.bulk import NewBatch
from inferq.shared.settings import Settings
from tests.support.asgi import call_api
from tests.support.echo import BULK_QUEUE, JSONL, echo_items, echo_jsonl, echo_worker


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    config = {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2]}}
    (tmp_path / "echo").mkdir()
    (tmp_path / "echo" / "config.json").write_text(json.dumps({**config, "max_batch": 1}))
    return Settings(redis_url=redis_url, models_dir=tmp_path)


def test_the_api_checks_an_upload_a_slice_of_lines_at_a_time(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[int] = []
    real = bulk_upload.LineChecker.take

    def spy(self: bulk_upload.LineChecker, lines: Any) -> None:
        taken.append(len(lines))
        real(self, lines)

    monkeypatch.setattr(bulk_upload.LineChecker, "take", spy)
    body = echo_jsonl(2500) + b'{"custom_id": "item-7", "inputs": [1, 2]}\n'  # a repeat, found across slices
    (response,) = call_api(settings, ("POST", "/v1/models/echo/batches", {"content": body, "headers": JSONL}))
    assert response.status_code == 202, response.text
    assert taken == [bulk_upload.SLICE_LINES] * 5 + [1]  # 500 lines a slice
    assert response.json()["refused"] == [
        {"line": 2501, "custom_id": None, "error": "line 2501: custom_id 'item-7' repeats line 8"}
    ]


def _unexpiring(redis: redis_py.Redis) -> list[bytes]:
    """Keys inferq writes (and RQ's job hashes) that would never expire."""
    found = [k for k in redis.scan_iter("inferq:*") if redis.ttl(k) == -1]
    return found + [k for k in redis.scan_iter("rq:job:*") if redis.ttl(k) == -1]


def test_an_upload_abandoned_while_staged_queues_nothing_and_expires(redis: redis_py.Redis, settings: Settings) -> None:
    writer = upload.BatchWriter(redis, settings, new_job_id(), "echo", keys.BULK, 1, 600)
    for item in echo_items(2 * upload.SLICE_CHUNKS + 20):
        writer.add(item)  # two slices staged, 20 items held; then the API dies
    assert writer.chunks == 2 * upload.SLICE_CHUNKS
    assert redis.llen(BULK_QUEUE) == 0 and bulk.read_batch(redis, writer.id) is None
    assert _unexpiring(redis) == []
    assert {redis.ttl(k) <= upload.STAGE_TTL_S for k in redis.scan_iter("*")} == {True}


def _pending(redis_url: str, batch_id: str) -> bool:
    """bulk.is_pending_async, as the API asks it."""

    async def ask() -> bool:
        client = AsyncRedis.from_url(redis_url)
        try:
            return await bulk.is_pending_async(client, batch_id)
        finally:
            await client.aclose()

    return asyncio.run(ask())


def test_an_upload_whose_api_died_mid_push_stays_hidden_and_every_chunk_it_queued_ends(
    redis: redis_py.Redis, redis_url: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = bulk_scripts.PUSH_CHUNKS
    pushes: list[int] = []

    class Dying:
        name = real.name

        def __call__(self, *args: Any) -> Any:
            if pushes:
                raise ConnectionError("the API died here")
            pushes.append(1)
            return real(*args)

    monkeypatch.setattr(bulk_scripts, "PUSH_CHUNKS", Dying())
    key = keys.idempotency_key("", "batch\0retry-me")
    new = NewBatch(new_job_id(), "echo", keys.BULK, 1, 600, items=echo_items(1500), idempotency=(key, "x y"))
    with pytest.raises(ConnectionError):
        bulk.enqueue_batch(redis, settings, new)
    assert redis.llen(BULK_QUEUE) == upload.PUSH_SLICE_CHUNKS  # the first push only
    assert bulk.read_batch(redis, new.id) is None and _pending(redis_url, new.id)
    assert bulk.cancel_batch(redis, settings, new.id) == "missing"
    assert 0 < redis.ttl(key) <= upload.PENDING_IDEMPOTENCY_TTL_S  # a retry makes a new batch once it lapses
    echo_worker(redis, settings).work(burst=True)
    assert redis.llen(BULK_QUEUE) == 0 and redis.zcard("rq:finished:inferq.echo.bulk") == upload.PUSH_SLICE_CHUNKS
    assert bulk.read_batch(redis, new.id) is None  # never visible, never ended: it expires with its TTL
    assert _unexpiring(redis) == []


def test_a_replay_answers_the_same_batch_waiting_a_while_for_one_still_being_queued(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"content": echo_jsonl(3) + b"not json\n", "headers": {**JSONL, "Idempotency-Key": "k"}}
    first, again = call_api(
        settings, ("POST", "/v1/models/echo/batches", body), ("POST", "/v1/models/echo/batches", body)
    )
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json()["id"] == first.json()["id"] and again.json()["refused"] == first.json()["refused"]
    assert again.json()["refused_count"] == 1 and redis.llen(BULK_QUEUE) == 3
    record = keys.batch_key(first.json()["id"])
    redis.hset(record, "pending", "1")  # as while its chunks were being queued
    shown = threading.Timer(0.2, redis.hdel, (record, "pending"))  # its upload's last step, soon
    shown.start()
    (waited,) = call_api(settings, ("POST", "/v1/models/echo/batches", body))
    shown.join()
    assert waited.status_code == 202 and waited.json()["id"] == first.json()["id"]
    redis.hset(record, "pending", "1")
    monkeypatch.setattr(batches, "PENDING_WAIT_S", 0.0)  # this time it is never shown
    (pending,) = call_api(settings, ("POST", "/v1/models/echo/batches", body))
    assert pending.status_code == 409 and pending.json()["error"]["code"] == "conflict"
    other = {**body, "content": echo_jsonl(4)}
    (changed,) = call_api(settings, ("POST", "/v1/models/echo/batches", other))
    assert changed.status_code == 422
    assert redis.llen(BULK_QUEUE) == 3 and len(list(redis.scan_iter("inferq:batch:*:ids"))) == 0


def test_lines_are_numbered_across_blocks_and_one_past_the_limit_is_dropped_unread() -> None:
    body = b'{"a": 1}\n\n' + b"x" * 25 + b'\n{"b": 2}\n{"c": 3}'
    blocks = [body[i : i + 4] for i in range(0, len(body), 4)]  # lines split across blocks of 4 bytes

    async def numbered() -> list[tuple[int, bytes | None]]:
        async def source() -> AsyncIterator[bytes]:
            for block in blocks:
                yield block

        hasher = hashlib.sha256()
        lines = [line async for line in bulk_upload._numbered_lines(source(), 20, hasher)]
        assert hasher.digest() == hashlib.sha256(body).digest()
        return lines

    assert asyncio.run(numbered()) == [(1, b'{"a": 1}'), (2, b""), (3, None), (4, b'{"b": 2}'), (5, b'{"c": 3}')]


def test_lines_read_from_any_blocks_are_the_body_split_at_its_newlines() -> None:
    rng = random.Random(7)
    for _ in range(200):
        body = b"".join(rng.choice([b"\n", b"ab", b"x" * rng.randint(1, 40)]) for _ in range(rng.randint(0, 30)))
        limit = rng.randint(1, 50)
        cuts = sorted(rng.sample(range(1, len(body)), min(rng.randint(0, 8), max(len(body) - 1, 0))))
        blocks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]

        async def numbered(blocks: list[bytes] = blocks, limit: int = limit) -> list[tuple[int, bytes | None]]:
            async def source() -> AsyncIterator[bytes]:
                for block in blocks:
                    yield block

            return [line async for line in bulk_upload._numbered_lines(source(), limit, None)]

        parts = body.split(b"\n")
        if parts and parts[-1] == b"":
            parts.pop()  # a final newline ends the last line; it starts none
        expected = [(n, None if len(p) > limit else p) for n, p in enumerate(parts, 1)]
        assert asyncio.run(numbered()) == expected, (body, blocks, limit)


def test_a_multipart_upload_is_read_from_its_file_field(redis: redis_py.Redis, settings: Settings) -> None:
    form, no_file = call_api(
        settings,
        ("POST", "/v1/models/echo/batches", {"files": {"file": ("items.jsonl", echo_jsonl(3), "application/jsonl")}}),
        ("POST", "/v1/models/echo/batches", {"data": {"other": "x"}, "files": {"x": ("x.txt", b"", "text/plain")}}),
    )
    assert form.status_code == 202, form.text
    assert form.json()["counts"]["queued"] == 3 and redis.llen(BULK_QUEUE) == 3
    assert no_file.status_code == 422
    assert no_file.json()["error"]["message"] == "the form needs a 'file' field holding the JSONL"
