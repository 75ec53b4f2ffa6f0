"""Bounded bulk work: an upload or a cancel is many small script calls, never one the size of the batch, and each
lane bounds its backlog (real redis-server, the API through httpx.ASGITransport, in-process workers)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

from inferq.shared import keys
from inferq.shared.jobs import new_job_id
from inferq.shared.lifecycle import bulk, lua
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


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Every script call, as (script, how many items it was given: chunks, for the bulk scripts)."""
    seen: list[tuple[str, int]] = []
    real = lua.Script.__call__

    def spy(self: lua.Script, client: Any, fixed: Any, items: Any = (), args: Any = (), **options: Any) -> Any:
        seen.append((self.name, len(items)))
        return real(self, client, fixed, items, args, **options)

    monkeypatch.setattr(lua.Script, "__call__", spy)
    yield seen


def _batch(redis: redis_py.Redis, settings: Settings, count: int, chunk_size: int = 1) -> str:
    new = NewBatch(new_job_id(), "echo", keys.BULK, chunk_size=chunk_size, result_ttl_s=600, items=echo_items(count))
    assert bulk.enqueue_batch(redis, settings, new) == ("ok", "")
    return new.id


def _lines(redis: redis_py.Redis, batch_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in bulk.result_lines(redis, batch_id, 0, 100_000)]


def test_a_cancel_is_a_slice_of_chunks_per_call_and_never_reads_a_long_queue_per_chunk(
    redis: redis_py.Redis, settings: Settings, calls: list[tuple[str, int]]
) -> None:
    """A 2,500-item batch of a max_batch-1 model: one call per 25 chunks (bulk.CANCEL_SLICE_CHUNKS), and no LREM
    over the 2,500-long queue (the old cancel: one call, and an LREM over the whole queue for every chunk)."""
    batch_id = _batch(redis, settings, 2500)
    calls.clear()
    redis.config_resetstat()
    assert bulk.cancel_batch(redis, settings, batch_id) == "ok"
    assert [n for name, n in calls] == [25] * 100
    assert all(name == "cancel-chunks" for name, _ in calls)
    assert "cmdstat_lrem" not in redis.info("commandstats")  # no queue entry read by a canceled chunk
    view = bulk.read_batch(redis, batch_id)
    assert view is not None and view["status"] == "canceled"
    assert view["counts"] == {"total": 2500, "queued": 0, "running": 0, "finished": 0, "failed": 0, "canceled": 2500}
    assert Counter(line["status"] for line in _lines(redis, batch_id)) == {"canceled": 2500}
    assert bulk.cancel_batch(redis, settings, batch_id) == "ended"
    # The canceled ids stay in the list until a worker pops them: the start drops each, and nothing runs.
    assert redis.llen(BULK_QUEUE) == 2500
    echo_worker(redis, settings).work(burst=True)
    assert redis.llen(BULK_QUEUE) == 0 and redis.zcard("rq:finished:inferq.echo.bulk") == 0
    assert bulk.read_batch(redis, batch_id)["counts"]["canceled"] == 2500  # type: ignore[index]


def test_a_cancel_takes_its_chunks_out_of_a_short_queue_at_once(redis: redis_py.Redis, settings: Settings) -> None:
    batch_id = _batch(redis, settings, 3)
    assert bulk.cancel_batch(redis, settings, batch_id) == "ok"
    assert redis.llen(BULK_QUEUE) == 0  # rq info is truthful without a worker passing by


def test_an_upload_is_staged_pushed_and_published_in_bounded_calls(
    redis: redis_py.Redis, settings: Settings, calls: list[tuple[str, int]]
) -> None:
    """The old upload was one call carrying every chunk (2,500 here). Slices: upload.SLICE_CHUNKS (25 chunks)
    staged and upload.PUSH_SLICE_CHUNKS (250) queued per call."""
    (response,) = call_api(
        settings, ("POST", "/v1/models/echo/batches", {"content": echo_jsonl(2500), "headers": JSONL})
    )
    assert response.status_code == 202, response.text
    assert max(n for _, n in calls) <= 250
    staged = [n for name, n in calls if name == "stage-chunks"]
    assert staged == [25] * 100
    assert [n for name, n in calls if name == "push-chunks"] == [250] * 10
    assert [name for name, _ in calls if name in ("queue-batch", "publish-batch")] == ["queue-batch", "publish-batch"]
    assert redis.llen(BULK_QUEUE) == 2500
    assert response.json()["counts"]["queued"] == 2500 and response.json()["status"] == "queued"


def test_an_interactive_upload_counts_its_chunks_against_the_queue_length(
    redis_url: str, redis: redis_py.Redis, settings: Settings
) -> None:
    settings = settings.model_copy(update={"max_queue_length": 5})
    post = "/v1/models/echo/batches?priority=interactive"
    too_many, fits, full, single = call_api(
        settings,
        ("POST", post, {"content": echo_jsonl(6), "headers": JSONL}),
        ("POST", post, {"content": echo_jsonl(4), "headers": JSONL}),
        ("POST", post, {"content": echo_jsonl(2), "headers": JSONL}),
        ("POST", "/v1/models/echo/jobs", {"json": {"inputs": [1, 2]}}),
    )
    assert too_many.status_code == 429 and too_many.headers["retry-after"] == "1"
    assert too_many.json()["error"] == {
        "code": "queue_full",
        "message": "the interactive lane of model echo has no room for this batch; retry later",
    }
    assert (fits.status_code, full.status_code, single.status_code) == (202, 429, 202)
    assert redis.llen("rq:queue:inferq.echo") == 5
    assert [k for k in redis.scan_iter("inferq:payload:batch-*")] == [
        k for k in redis.scan_iter("inferq:payload:batch-*") if fits.json()["id"].encode() in k
    ]  # the refused uploads' staged chunks are gone


def test_the_bulk_lane_bounds_its_waiting_items(redis: redis_py.Redis, settings: Settings) -> None:
    settings = settings.model_copy(update={"max_bulk_queued_items": 10})
    post = "/v1/models/echo/batches"
    first, full, never = call_api(
        settings,
        ("POST", post, {"content": echo_jsonl(8), "headers": JSONL}),
        ("POST", post, {"content": echo_jsonl(3, "b"), "headers": JSONL}),
        ("POST", post, {"content": echo_jsonl(11, "c"), "headers": JSONL}),
    )
    assert first.status_code == 202 and full.status_code == 429 and never.status_code == 413
    assert "more than 10 items" in never.json()["error"]["message"]
    waiting = keys.waiting_items_key("inferq.echo.bulk")
    assert redis.get(waiting) == b"8" and redis.ttl(waiting) > 0
    worker = echo_worker(redis, settings)
    queue = next(q for q in worker.queues if q.name == "inferq.echo.bulk")
    redis.lmove(queue.key, queue.intermediate_queue_key)
    worker._start(queue, worker._collect(queue, keys.chunk_id(first.json()["id"], 0), 1))
    assert redis.get(waiting) == b"7"  # a started item no longer waits
    assert bulk.cancel_batch(redis, settings, first.json()["id"]) == "ok"
    assert redis.get(waiting) == b"0"
    (room,) = call_api(settings, ("POST", post, {"content": echo_jsonl(10, "d"), "headers": JSONL}))
    assert room.status_code == 202 and redis.get(waiting) == b"10"


def test_an_upload_larger_than_its_tenants_whole_bulk_lines_quota_is_413_not_a_retryable_429(
    redis: redis_py.Redis, settings: Settings
) -> None:
    """An upload that can never fit got the quota's 429 with Retry-After: 10, and `inferq batch` retried it."""
    tenants = [{"name": "acme", "key": "key-acme", "quotas": {"bulk_lines": 5}}]
    settings = Settings(redis_url=settings.redis_url, models_dir=settings.models_dir, tenants=json.dumps(tenants))
    post = "/v1/models/echo/batches"
    acme = {**JSONL, "Authorization": "Bearer key-acme"}
    never, fits, full = call_api(
        settings,
        ("POST", post, {"content": echo_jsonl(6), "headers": acme}),
        ("POST", post, {"content": echo_jsonl(5, "b"), "headers": acme}),  # the whole quota: it fits
        ("POST", post, {"content": echo_jsonl(1, "c"), "headers": acme}),  # fits once the others ran: a 429
    )
    assert never.status_code == 413 and "retry-after" not in never.headers
    assert never.json()["error"] == {
        "code": "payload_too_large",
        "message": "the upload holds more than 5 items, tenant acme's whole bulk_lines quota (its upload lines that"
        " may wait at once): it can never be queued; split it",
    }
    assert fits.status_code == 202, fits.text
    assert full.status_code == 429 and full.headers["retry-after"] == "10"
    assert redis.llen(BULK_QUEUE) == 5  # the refused uploads left nothing queued or staged
    assert [k for k in redis.scan_iter("inferq:payload:*") if fits.json()["id"].encode() not in k] == []
