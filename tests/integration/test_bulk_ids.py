"""Whatever a custom_id holds, no script that ends a chunk fails on it (real redis-server, in-process workers).

The batches here are written straight through ``bulk.enqueue_batch``, as data stored before the upload refused
such ids (or a future bug) would be: a lone UTF-16 surrogate, which Python's JSON takes and Redis's cjson refuses.
"""

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
from inferq.shared.jobs import new_job_id
from inferq.shared.lifecycle import bulk
from inferq.shared.lifecycle.bulk import BulkItem, NewBatch
from inferq.shared.rqjson import JSONJob
from inferq.shared.settings import Settings
from inferq.workers.batching import BatchWorker
from tests.support.echo import echo_runner

BAD = "bad-\ud800"
ECHO = {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2]}}


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    (tmp_path / "echo").mkdir()
    (tmp_path / "echo" / "config.json").write_text(json.dumps(ECHO))
    return Settings(redis_url=redis_url, models_dir=tmp_path)


def _batch(redis: redis_py.Redis, settings: Settings, chunk_size: int = 2) -> str:
    ids = ["item-0", BAD, "item-2", 'quote"\\back\nline']
    items = [BulkItem(i, json.dumps({"inputs": [n, n]}).encode(), "application/json") for n, i in enumerate(ids)]
    new = NewBatch(new_job_id(), "echo", keys.BULK, chunk_size=chunk_size, result_ttl_s=600, items=items)
    assert bulk.enqueue_batch(redis, settings, new) == ("ok", "")
    return new.id


def _lines(redis: redis_py.Redis, batch_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in bulk.result_lines(redis, batch_id, 0, 100)]


def _worker(redis: redis_py.Redis, settings: Settings, name: str) -> BatchWorker:
    return BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name=name)


def test_a_cancel_of_a_batch_holding_a_lone_surrogate_id_answers_200_and_ends_every_line(
    redis: redis_py.Redis, settings: Settings
) -> None:
    batch_id = _batch(redis, settings)

    async def cancel() -> httpx.Response:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://inferq") as client:
                return await client.post(f"/v1/batches/{batch_id}/cancel")

    response = asyncio.run(cancel())
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "canceled"
    assert response.json()["counts"] == {
        "total": 4,
        "queued": 0,
        "running": 0,
        "finished": 0,
        "failed": 0,
        "canceled": 4,
    }
    lines = _lines(redis, batch_id)
    assert sorted(line["custom_id"] for line in lines) == sorted(["item-0", BAD, "item-2", 'quote"\\back\nline'])
    assert {line["status"] for line in lines} == {"canceled"}


def test_a_chunk_holding_a_lone_surrogate_id_that_expired_in_its_queue_ends_expired(
    redis: redis_py.Redis, settings: Settings
) -> None:
    batch_id = _batch(redis, settings)
    chunk = keys.chunk_id(batch_id, 0)  # item-0 and the surrogate
    redis.delete(JSONJob.key_for(chunk))  # its queue TTL (the batch window) ended
    redis.hset(keys.info_key(chunk), "deadline", "1")
    _worker(redis, settings, "expiry-ids").work(burst=True)
    # The worker went on past the expired chunk: the chunk behind it ran.
    by_id = {line["custom_id"]: line for line in _lines(redis, batch_id)}
    error = "expired: still queued when the batch window ended"
    assert by_id[BAD] == by_id["item-0"] | {"custom_id": BAD} == {"custom_id": BAD, "status": "expired", "error": error}
    assert by_id["item-2"]["status"] == by_id['quote"\\back\nline']["status"] == "finished"
    assert len(by_id) == 4
    view = bulk.read_batch(redis, batch_id)
    assert view is not None and view["status"] == "finished"
    assert view["counts"] == {"total": 4, "queued": 0, "running": 0, "finished": 2, "failed": 2, "canceled": 0}
    assert redis.llen("rq:queue:inferq.echo.bulk") == 0 and redis.llen("rq:queue:inferq.echo.bulk:intermediate") == 0
    assert redis.get(keys.waiting_items_key("inferq.echo.bulk")) == b"0"  # the expired items wait no more


def test_a_chunk_holding_a_lone_surrogate_id_whose_worker_died_with_no_retries_ends_failed(
    redis_url: str, redis: redis_py.Redis, tmp_path: Path
) -> None:
    settings = Settings(redis_url=redis_url, job_retries=0)
    batch_id = _batch(redis, settings, chunk_size=4)
    dead = _worker(redis, settings, "dead-ids")
    queue = next(q for q in dead.queues if q.name == "inferq.echo.bulk")
    redis.lmove(queue.key, queue.intermediate_queue_key)
    items = dead._start(queue, dead._collect(queue, keys.chunk_id(batch_id, 0), 4))
    redis.zadd("rq:wip:inferq.echo.bulk", {f"{items[0].job.id}:{items[0].job.execution_id}": 1})  # heartbeat lapsed
    cleaner = _worker(redis, settings, "cleaner-ids")
    cleaner.clean_registries()  # RQ's maintenance fails the chunk; the announcement writes its lines
    lines = _lines(redis, batch_id)
    assert sorted(line["custom_id"] for line in lines) == sorted(["item-0", BAD, "item-2", 'quote"\\back\nline'])
    assert {line["status"] for line in lines} == {"failed"}
    view = bulk.read_batch(redis, batch_id)
    assert view is not None and view["status"] == "finished"
    assert view["counts"] == {"total": 4, "queued": 0, "running": 0, "finished": 0, "failed": 4, "canceled": 0}


def test_an_upload_refuses_a_custom_id_with_no_utf8_form_by_its_line(redis: redis_py.Redis, settings: Settings) -> None:
    body = b'{"custom_id": "fine", "inputs": [1, 2]}\n{"custom_id": "bad-\\ud800", "inputs": [3, 4]}\n'

    async def upload() -> httpx.Response:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://inferq") as client:
                return await client.post(
                    "/v1/models/echo/batches", content=body, headers={"content-type": "application/jsonl"}
                )

    response = asyncio.run(upload())
    assert response.status_code == 202, response.text
    answer = response.json()
    assert answer["total"] == 1 and answer["refused_count"] == 1
    error = "line 2: custom_id must be Unicode text: it holds a lone UTF-16 surrogate (\\ud800-\\udfff)"
    assert answer["refused"] == [{"line": 2, "custom_id": None, "error": error}]
    assert _lines(redis, answer["id"]) == []  # a refused id writes no line: it has no text to write
